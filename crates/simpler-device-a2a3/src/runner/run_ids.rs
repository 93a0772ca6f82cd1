//! The run ids a runner has used, so a second run with the same id is refused before its
//! reports and trace files overwrite the first's.
//!
//! A run id is used once `prepare` created the run (P5 passed): from then on the run has a
//! report and may export files. A `prepare` refused earlier (busy, unusable, bad
//! configuration, unknown callable) leaves the id free. The key is the run id together with
//! the engine task the request names (`RunRequest::with_origin`): the tasks of one engine run
//! share its run id and differ by origin.
//!
//! Memory is bounded: the runner remembers the last [`RUN_ID_MEMORY`] keys (decision: engine
//! runs interleave on a chip and their tasks arrive in dependency order, so "ids must
//! increase" would refuse valid requests; a window that covers far more runs than can be in
//! flight catches every reuse a caller can make by mistake at a fixed cost).

use std::collections::{HashSet, VecDeque};

use simpler_types::{RunId, TaskId};

/// How many of the latest run keys a runner remembers.
pub const RUN_ID_MEMORY: usize = 4096;

type RunKey = (RunId, Option<TaskId>);

/// The latest [`RUN_ID_MEMORY`] run keys of one runner.
#[derive(Debug, Default)]
pub(super) struct UsedRunIds {
    set: HashSet<RunKey>,
    order: VecDeque<RunKey>,
}

impl UsedRunIds {
    /// Whether `key` is among the remembered keys.
    pub(super) fn contains(&self, run_id: RunId, origin: Option<TaskId>) -> bool {
        self.set.contains(&(run_id, origin))
    }

    /// Remembers `key`, forgetting the oldest one when full.
    pub(super) fn insert(&mut self, run_id: RunId, origin: Option<TaskId>) {
        if !self.set.insert((run_id, origin)) {
            return;
        }
        self.order.push_back((run_id, origin));
        if self.order.len() > RUN_ID_MEMORY
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_holds_the_latest_keys_and_stays_bounded() {
        let id = |n| RunId::from_raw(n).unwrap();
        let mut used = UsedRunIds::default();
        for n in 1..=(RUN_ID_MEMORY as u64 + 10) {
            assert!(!used.contains(id(n), None));
            used.insert(id(n), None);
            assert!(used.contains(id(n), None));
        }
        assert_eq!((used.set.len(), used.order.len()), (RUN_ID_MEMORY, RUN_ID_MEMORY));
        assert!(!used.contains(id(10), None), "the oldest keys are forgotten");
        assert!(used.contains(id(11), None) && used.contains(id(RUN_ID_MEMORY as u64 + 10), None));
        // An origin makes a different key; inserting a known key again changes nothing.
        let task = simpler_types::TaskId::new(id(11), 3);
        assert!(!used.contains(id(11), Some(task)));
        used.insert(id(11), None);
        assert_eq!(used.order.len(), RUN_ID_MEMORY);
    }
}
