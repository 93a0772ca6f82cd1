//! The test process around the engine: engine start, planned-panic silencing, engine threads
//! still alive, and warnings the engine emits while a run is released.

use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use simpler_ring::RingConfig;
use simpler_sched::{Engine, EngineConfig};
use simpler_types::WorkerType;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, filter::LevelFilter};

use super::endpoint::{PlanEndpoint, Recorder};
use super::plan::{EngineShape, PLANNED};

/// Upper bound for anything a test waits for; it only catches hangs.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Starts an engine of `shape` at `level` whose endpoints log into `recorder`. Rings are small
/// (256 KiB each) so that slabs are reused often.
pub fn start_engine(shape: &EngineShape, level: u8, recorder: &Arc<Recorder>) -> Engine {
    silence_planned_panics();
    Engine::start(EngineConfig {
        ring: RingConfig {
            heap_bytes_per_ring: 256 << 10,
            alloc_timeout: Duration::from_secs(5),
            ..RingConfig::default()
        },
        next_level: shape
            .next_level
            .iter()
            .map(|&id| PlanEndpoint::boxed(WorkerType::NextLevel, id, recorder))
            .collect(),
        sub: (0..shape.subs).map(|i| PlanEndpoint::boxed(WorkerType::Sub, i, recorder)).collect(),
        level,
        ..EngineConfig::default()
    })
    .expect("engine starts")
}

/// Installs (once per process) a panic hook that keeps planned endpoint panics off stderr and
/// forwards every other panic to the default hook.
pub fn silence_planned_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planned =
                info.payload().downcast_ref::<String>().is_some_and(|s| s.starts_with(PLANNED));
            if !planned {
                default(info);
            }
        }));
    });
}

/// Names of this process's threads (as the kernel truncates them: 15 bytes).
pub fn thread_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .map(|s| s.trim_end().to_owned())
        .collect()
}

/// Engine threads of `level` still alive, after giving exiting threads a moment to vanish from
/// `/proc` (joined threads can linger there very briefly).
pub fn engine_threads_alive(level: u8) -> Vec<String> {
    let prefix = format!("simpler-l{level}-");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: Vec<String> =
            thread_names().into_iter().filter(|n| n.starts_with(&prefix)).collect();
        if alive.is_empty() || Instant::now() >= deadline {
            return alive;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One warning event: its fields, rendered.
#[derive(Clone, Debug)]
pub struct Warning {
    /// `(field name, value)` pairs, the message included.
    pub fields: Vec<(String, String)>,
}

impl Warning {
    /// The value of field `name`, if present.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Collects the warnings emitted on the current thread while a [`WarningCapture`] guard lives.
#[derive(Clone, Default)]
pub struct WarningCapture {
    seen: Arc<Mutex<Vec<Warning>>>,
}

struct CaptureLayer(Arc<Mutex<Vec<Warning>>>);

struct FieldVisitor<'a>(&'a mut Vec<(String, String)>);

impl Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber> Layer<S> for CaptureLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut FieldVisitor(&mut fields));
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(Warning { fields });
    }
}

impl WarningCapture {
    /// Starts capturing warnings on this thread; capture ends when the guard drops.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let layer = CaptureLayer(Arc::clone(&self.seen)).with_filter(LevelFilter::WARN);
        tracing::subscriber::set_default(tracing_subscriber::registry().with(layer))
    }

    /// Takes the warnings captured so far.
    pub fn take(&self) -> Vec<Warning> {
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
