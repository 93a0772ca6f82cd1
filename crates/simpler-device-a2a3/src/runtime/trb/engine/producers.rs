//! The producers of one submit: taking and returning references on them, and, for the
//! dependency diagnostics, the ones its lookups found already finished and so did not wait for
//! (`docs/device-trb.md`, "Diagnostics").

use super::{Engine, SubmitRefusal, USED_AFTER_SCOPE};
use crate::abi::image::SUBMIT_RECORD_PRODUCERS;

/// Producers a submit found but needs no edge to, because they finished: a blind write after a
/// finished access, an in-place update after a finished reader, or a producer consumed between
/// its lookup and the submit's reference. Only noted while the diagnostics record submits; the
/// first [`SUBMIT_RECORD_PRODUCERS`] are kept (the record has room for no more).
pub(crate) struct Finished {
    noting: bool,
    ids: [u64; SUBMIT_RECORD_PRODUCERS],
    len: usize,
    /// Notes that found no room (possibly repeats): the record counts them, so that the host
    /// knows its list was cut short.
    beyond: usize,
}

impl Finished {
    pub(super) fn new() -> Finished {
        Finished { noting: false, ids: [0; SUBMIT_RECORD_PRODUCERS], len: 0, beyond: 0 }
    }

    /// Notes `id` once, while noting.
    pub(super) fn note(&mut self, id: u64) {
        if !self.noting || self.ids[..self.len].contains(&id) {
            return;
        }
        if self.len < self.ids.len() {
            self.ids[self.len] = id;
            self.len += 1;
        } else {
            self.beyond += 1;
        }
    }

    /// Forgets what the previous submit noted.
    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.beyond = 0;
    }

    /// Drops the noted ids that `wired` holds (a producer found finished through one access and
    /// waited for through another).
    pub(super) fn drop_wired(&mut self, wired: &[u64]) {
        let mut kept = 0;
        for k in 0..self.len {
            if !wired.contains(&self.ids[k]) {
                self.ids[kept] = self.ids[k];
                kept += 1;
            }
        }
        self.len = kept;
    }
}

impl Engine<'_> {
    /// Makes the submits note the producers they found finished (for the submit records).
    pub(crate) fn note_finished_producers(&mut self) {
        self.finished.noting = true;
    }

    /// The producers the last accepted submit found through the tensor map and waits for (for
    /// the dependency graph's diagnostics).
    pub(crate) fn last_producers(&self) -> &[u64] {
        &self.producers[..self.linked]
    }

    /// The producers the last accepted submit found finished and did not wait for; empty
    /// unless [`note_finished_producers`](Self::note_finished_producers) was called.
    pub(crate) fn last_finished(&self) -> &[u64] {
        &self.finished.ids[..self.finished.len]
    }

    /// How many more producers the last accepted submit found finished than
    /// [`last_finished`](Self::last_finished) lists (an upper bound: repeats may be counted).
    pub(crate) fn last_finished_beyond(&self) -> usize {
        self.finished.beyond
    }

    /// Takes a reference on each of the first `count` producers before the submit commits
    /// (those below `linked` are waited for, the rest only held). One waited for that has none
    /// left was consumed since its lookup, so it completed: nothing to wait for or hold, and it
    /// is dropped. A slot of `keep` cannot be consumed while its scope holds it; if one were,
    /// the references taken are returned and the submit is refused rather than run without it.
    /// Returns how many producers are left and how many of them are waited for.
    pub(super) fn acquire_producers(
        &mut self,
        count: usize,
        linked: usize,
        keep: &[u64],
    ) -> Result<(usize, usize), SubmitRefusal> {
        let (mut held, mut waited) = (0, 0);
        for k in 0..count {
            let p = self.producers[k];
            if self.shared.acquire(p) {
                self.producers[held] = p;
                held += 1;
                waited += usize::from(k < linked);
            } else if k >= linked || keep.contains(&p) {
                self.release_producers(held);
                return Err(SubmitRefusal::Invalid(USED_AFTER_SCOPE));
            } else {
                self.finished.note(p);
            }
        }
        Ok((held, waited))
    }

    /// Returns the references [`acquire_producers`](Self::acquire_producers) took on the first
    /// `count` producers.
    pub(super) fn release_producers(&self, count: usize) {
        for &p in &self.producers[..count] {
            self.shared.release(p);
        }
    }
}
