//! Start step 2: every chip of a builder attached in parallel on start-up threads, its
//! callables prepared and prewarmed within the deadline; all or nothing.

use super::*;
use crate::error::RegistrationFailure;

/// How one chip's start-up failed, as its start-up thread reports it. `residue` is what ending
/// the chip left behind: a chip process that failed after it was ready is shut down, and what
/// its finalize or its end left (a stuck device thread, a process that had to be killed) goes
/// to the start error's rollback.
pub(crate) enum AttachFailure {
    /// The chip or its process failed: the device's code, when one exists, what happened, and
    /// the typed error, when there is one.
    Failed {
        code: Option<simpler_types::DeviceCode>,
        message: String,
        error: Option<Arc<RegistrationFailure>>,
        residue: Vec<Residue>,
    },
    /// The start deadline passed during `step` (a chip process was killed and reaped, or shut
    /// down).
    Deadline { step: String, residue: Vec<Residue> },
}

impl AttachFailure {
    /// The same failure, with what ending the chip left behind.
    pub(crate) fn with_residue(mut self, left: Vec<Residue>) -> AttachFailure {
        match &mut self {
            AttachFailure::Failed { residue, .. } | AttachFailure::Deadline { residue, .. } => {
                residue.extend(left);
            }
        }
        self
    }
}

impl From<DeviceError> for AttachFailure {
    fn from(e: DeviceError) -> AttachFailure {
        RegistrationFailure::Device(e).into()
    }
}

impl From<RegistrationFailure> for AttachFailure {
    fn from(e: RegistrationFailure) -> AttachFailure {
        let (code, message) = (e.device_code(), e.to_string());
        AttachFailure::Failed { code, message, error: Some(Arc::new(e)), residue: Vec::new() }
    }
}

/// The rollback entries of what ending chips of `path` left behind (each names its chip).
pub(super) fn residue_entries(
    path: &str,
    residue: Vec<Residue>,
) -> impl Iterator<Item = TeardownError> + '_ {
    residue.into_iter().map(move |r| r.into_teardown(path))
}

/// Attaches every chip in parallel, prepares `callables` on each and prewarms; all or nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn attach_chips(
    platform: Platform,
    runtime: RuntimeVariant,
    devices: &[u32],
    callables: &[ChipCallable],
    prewarm: Option<&CallConfig>,
    options: Option<&Arc<ChipOptionsFn>>,
    faults: &Faults,
    process: Option<&Arc<ProcessOptions>>,
    deadline: Option<Instant>,
    budget: Duration,
    path: &str,
) -> Result<Vec<ChipState>, StartError> {
    let (tx, rx) = mpsc::channel::<(usize, Result<ChipState, AttachFailure>)>();
    let mut pending: Vec<Option<String>> = Vec::new();
    // An attach thread that has reported is joined at once (it only has to return), so that
    // `start` leaves no thread of its own behind; one still attaching at the deadline is
    // detached.
    let mut attachers: Vec<Option<std::thread::JoinHandle<()>>> = Vec::new();
    let mut spawn_failure = None;
    for (i, &device) in devices.iter().enumerate() {
        let tx = tx.clone();
        let callables = callables.to_vec();
        let prewarm = prewarm.cloned();
        let options = options.cloned();
        let faults = faults.clone();
        let process = process.cloned();
        let chip_path = format!("{path} / chip {i} (device {device})");
        let refused = faults.hit(WorkerId(i as u32), Fault::AttachThreadRefused);
        let attach = std::thread::Builder::new().name(format!("simpler-attach-{device}"));
        let spawned = if refused {
            Err(std::io::Error::other("the attach thread was refused by an injected fault"))
        } else {
            attach.spawn(move || {
                // A panic (in the user's `chip_options` closure, or below) is caught here and
                // reported as this chip's failure; uncaught, it would look like a timeout.
                let r = catch_unwind(AssertUnwindSafe(|| {
                    let chip = WorkerId(i as u32);
                    if faults.hit(chip, Fault::Attach) {
                        return Err(DeviceError::Busy {
                            call: "attach",
                            state: "an injected fault is armed".to_owned(),
                        }
                        .into());
                    }
                    if let Some(opts) = process {
                        let init = ChipInit { platform, runtime, device, prewarm };
                        return crate::process::start_chip(
                            chip, init, opts, deadline, &callables, faults,
                        );
                    }
                    let opts = RunnerOptions::new(platform, device, runtime);
                    let opts = match &options {
                        Some(f) => f(opts),
                        None => opts,
                    };
                    let mut runner = DeviceRunner::attach(opts)?;
                    if let Some(cfg) = &prewarm {
                        runner.prewarm(cfg)?;
                    }
                    let mut state = ChipState::new(chip, runner, faults);
                    for c in &callables {
                        state.register(c)?;
                    }
                    Ok::<_, AttachFailure>(state)
                }));
                let r = match r {
                    Ok(r) => r,
                    Err(p) => Err(AttachFailure::Failed {
                        code: None,
                        message: format!("the attach panicked: {}", panic_text(p.as_ref())),
                        error: None,
                        residue: Vec::new(),
                    }),
                };
                let _ = tx.send((i, r));
            })
        };
        match spawned {
            Ok(t) => attachers.push(Some(t)),
            Err(e) => {
                // The chips already attaching are collected below as after any failure: each
                // is waited for and finalized into the rollback before `start` returns.
                let cause =
                    StartCause::ThreadSpawn { thread: "an attach thread", source: Arc::new(e) };
                spawn_failure = Some(start_err(cause, &chip_path));
                break;
            }
        }
        pending.push(Some(chip_path));
    }
    drop(tx);
    let mut states: Vec<Option<ChipState>> = (0..devices.len()).map(|_| None).collect();
    let mut failure: Option<StartError> = spawn_failure;
    // The step a chip process was in when the start deadline passed, when it said.
    let mut steps: Vec<Option<String>> = vec![None; devices.len()];
    let mut deadline_passed = false;
    // What ending the chips that failed left behind, for the rollback of whichever failure
    // `start` reports.
    let mut left: Vec<TeardownError> = Vec::new();
    while pending.iter().any(Option::is_some) {
        let received = match deadline {
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        if let Ok((i, _)) = &received
            && let Some(t) = attachers.get_mut(*i).and_then(Option::take)
        {
            // The send is the thread's last act, so this join only waits for it to return.
            let _ = t.join();
        }
        match received {
            Ok((i, Ok(state))) => {
                pending[i] = None;
                states[i] = Some(state);
            }
            Ok((i, Err(AttachFailure::Failed { code, message, error, residue }))) => {
                left.extend(residue_entries(path, residue));
                let p = pending[i].take().unwrap_or_default();
                if failure.is_none() {
                    let chip = WorkerId(i as u32);
                    failure =
                        Some(start_err(StartCause::Device { chip, code, message, error }, &p));
                }
            }
            Ok((i, Err(AttachFailure::Deadline { step, residue }))) => {
                left.extend(residue_entries(path, residue));
                steps[i] = Some(step);
                deadline_passed = true;
                break;
            }
            Err(_) => {
                deadline_passed = true;
                break;
            }
        }
    }
    if deadline_passed {
        let at_deadline: Vec<(usize, String)> =
            pending.iter().enumerate().filter_map(|(i, p)| Some((i, p.clone()?))).collect();
        // Chips still starting at the deadline, by index.
        let mut rollback: Vec<(usize, TeardownCause)> = Vec::new();
        let device = |i: usize| devices.get(i).copied().unwrap_or_default();
        if process.is_some() {
            // A chip process still starting is killed at this same deadline by its start-up
            // thread; waiting for that thread here means `start` returns with every child
            // reaped. One whose start-up finished after all is finalized below with the others.
            for t in attachers.iter_mut().filter_map(Option::take) {
                let _ = t.join();
            }
            for (i, r) in rx.try_iter() {
                match r {
                    Ok(state) => {
                        states[i] = Some(state);
                        if pending[i].take().is_some() {
                            rollback.push((i, TeardownCause::StartedLate { device: device(i) }));
                        }
                    }
                    Err(AttachFailure::Deadline { step, residue }) => {
                        left.extend(residue_entries(path, residue));
                        steps[i] = Some(step);
                    }
                    Err(AttachFailure::Failed { residue, .. }) => {
                        // It failed by itself after the deadline: not a chip the deadline
                        // killed.
                        left.extend(residue_entries(path, residue));
                        pending[i] = None;
                    }
                }
            }
            for (i, _) in pending.iter().enumerate().filter(|(_, p)| p.is_some()) {
                rollback.push((i, TeardownCause::StartKilled { device: device(i) }));
            }
        } else {
            for (i, _) in pending.iter().enumerate().filter(|(_, p)| p.is_some()) {
                rollback.push((i, TeardownCause::AttachDetached { device: device(i) }));
            }
        }
        let rollback = rollback.into_iter().map(|(i, cause)| TeardownError {
            path: path.to_owned(),
            what: TeardownPart::Chip(WorkerId(i as u32)),
            cause,
        });
        match &mut failure {
            // A failure before the deadline passed (a chip that failed to attach, a refused
            // attach thread) doomed the start: it stays the cause, and the chips still
            // attaching at the deadline join its rollback.
            Some(earlier) => earlier.rollback.extend(rollback),
            None => {
                // Every chip pending at the deadline is named, with its step when known.
                let names: Vec<String> = at_deadline
                    .iter()
                    .map(|(i, n)| match &steps[*i] {
                        Some(step) => format!("{n}: {step}"),
                        None => n.clone(),
                    })
                    .collect();
                let first = at_deadline.first().map_or(path, |(_, n)| n.as_str());
                let mut e =
                    start_err(StartCause::DeadlineExceeded { pending: names, budget }, first);
                e.rollback.extend(rollback);
                failure = Some(e);
            }
        }
    }
    match failure {
        None => Ok(states.into_iter().flatten().collect()),
        Some(mut e) => {
            e.rollback.extend(left);
            for mut s in states.into_iter().flatten() {
                e.rollback.extend(residue_entries(path, s.finalize()));
            }
            Err(e)
        }
    }
}
