//! One argument path: a chip orchestration, a sub worker's closure and a child's graph receive
//! exactly the (tensor, tag, scalar) lists their caller passed, at L2, L3 and L4.
//!
//! The chip orchestration records what it is handed; its first scalar is a marker naming the
//! test, so tests running at the same time do not read each other's records.

use std::sync::{Arc, Mutex};

use simpler::device_a2a3::{ChipCallable, OrchArgs, OrchConfig, OrchCtx, OrchError};
use simpler::device_a2a3::{Platform, RuntimeVariant};
use simpler::types::{
    CallConfig, DataType, TaskArgs, TaskArgsView, Tensor, TensorArgType, WorkerId,
};
use simpler::worker::{ChipMemory, DeviceBuffer, Orchestration, Worker};

/// What one callable received: tensors, their tags, scalars.
type Received = (Vec<Tensor>, Vec<TensorArgType>, Vec<u64>);

static CHIP_RECORDS: Mutex<Vec<Received>> = Mutex::new(Vec::new());

fn received(view: TaskArgsView<'_>) -> Received {
    (view.tensors.to_vec(), view.tags.to_vec(), view.scalars.to_vec())
}

fn record_entry(_: &mut OrchCtx<'_>, args: &OrchArgs<'_>) -> Result<(), OrchError> {
    let tags = (0..args.tensors().len()).filter_map(|i| args.tag(i)).collect();
    let r = (args.tensors().to_vec(), tags, args.scalars().to_vec());
    CHIP_RECORDS.lock().map_err(|_| OrchError::from_status(-1))?.push(r);
    Ok(())
}

fn record_config(_: &OrchArgs<'_>) -> OrchConfig {
    OrchConfig { expected_arg_count: 0 }
}

fn recorder() -> ChipCallable {
    ChipCallable::native(record_entry, record_config)
        .names("record_args", "record_args_config")
        .build()
        .expect("valid callable")
}

/// The records of the chip orchestration carrying `marker` as its first scalar.
fn chip_records(marker: u64) -> Vec<Received> {
    let all = CHIP_RECORDS.lock().expect("records");
    all.iter().filter(|r| r.2.first() == Some(&marker)).cloned().collect()
}

const TAGS: [TensorArgType; 5] = [
    TensorArgType::Input,
    TensorArgType::Output,
    TensorArgType::InOut,
    TensorArgType::OutputExisting,
    TensorArgType::NoDep,
];

/// `tensors` with every tag in turn, then the scalars `marker, 7, u64::MAX`.
fn tagged(tensors: impl IntoIterator<Item = Tensor>, marker: u64) -> TaskArgs {
    let mut args = TaskArgs::new();
    for (t, tag) in tensors.into_iter().zip(TAGS) {
        args.add_tensor(t, tag).expect("arg");
    }
    args.add_scalar(marker).expect("scalar").add_scalar(7).expect("scalar");
    args.add_scalar(u64::MAX).expect("scalar");
    args
}

/// Every tag over its own buffer of `mem`, then the scalars of [`tagged`].
fn mixed_args(mem: &ChipMemory<'_>, marker: u64) -> (TaskArgs, Vec<DeviceBuffer>) {
    let bufs: Vec<DeviceBuffer> = TAGS.iter().map(|_| mem.malloc(256).expect("malloc")).collect();
    let tensors = bufs.iter().map(|b| b.tensor(&[64], DataType::Float32).expect("tensor"));
    (tagged(tensors, marker), bufs)
}

/// Every tag over host tensors (a sub worker takes no chip memory).
fn host_args(marker: u64) -> TaskArgs {
    let tensors = (1..=TAGS.len() as u64)
        .map(|i| Tensor::external(i << 16, &[64], DataType::Float32).expect("tensor"));
    tagged(tensors, marker)
}

fn free_all(mem: &ChipMemory<'_>, bufs: Vec<DeviceBuffer>) {
    for b in bufs {
        mem.free(b).expect("free");
    }
}

#[test]
fn an_l2_chip_orchestration_sees_the_submitted_tags() {
    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let chip = b.register_chip(recorder());
    let w = b.start().expect("start");
    let mem = w.memory().expect("memory");
    let (args, bufs) = mixed_args(&mem, 2);
    w.run(Orchestration::chip(chip, args.clone())).expect("run");
    assert_eq!(chip_records(2), vec![received(args.view())]);
    free_all(&mem, bufs);
    w.close().expect("close");
}

#[test]
fn an_l3_chip_task_and_a_sub_task_see_the_submitted_tags() {
    let sub_records: Arc<Mutex<Vec<Received>>> = Arc::default();
    let mut b =
        Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]).sub_workers(1);
    let chip = b.register_chip(recorder());
    let seen = Arc::clone(&sub_records);
    let sub = b.register_host("record", move |view| {
        seen.lock().map_err(|_| "poisoned")?.push(received(view));
        Ok(())
    });
    let w = b.start().expect("start");
    let mem = w.chip_memory(WorkerId(0)).expect("memory");
    let (args, bufs) = mixed_args(&mem, 3);
    let sub_args = host_args(30);
    let (a, s) = (args.clone(), sub_args.clone());
    w.run(Orchestration::graph(move |g, _, _| {
        g.submit_next_level(chip, a.clone(), &CallConfig::default(), WorkerId(0))?;
        g.submit_sub(sub, s.clone())?;
        Ok(())
    }))
    .expect("run");
    assert_eq!(chip_records(3), vec![received(args.view())]);
    assert_eq!(*sub_records.lock().expect("records"), vec![received(sub_args.view())]);
    free_all(&mem, bufs);
    w.close().expect("close");
}

#[test]
fn an_l4_graph_passes_the_submitted_tags_through_its_child_to_the_chip() {
    let mut l3 = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph).chips(&[0]);
    let chip = l3.register_chip(recorder());
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("child");
    let setup_args: Arc<Mutex<Option<TaskArgs>>> = Arc::default();
    let graph_views: Arc<Mutex<Vec<Received>>> = Arc::default();
    // Allocates the child's buffers from inside the child and publishes the arguments.
    let out = Arc::clone(&setup_args);
    let setup = l4.register_graph("setup", move |g, _, _| {
        let mem = g.chip_memory(WorkerId(0))?;
        let (args, _bufs) = mixed_args(&mem, 4);
        *out.lock().map_err(|_| "poisoned")? = Some(args);
        Ok(())
    });
    // Runs on the child: records its view and forwards it unchanged to the chip.
    let views = Arc::clone(&graph_views);
    let forward = l4.register_graph("forward", move |g, view, cfg| {
        views.lock().map_err(|_| "poisoned")?.push(received(view));
        g.submit_next_level(chip, TaskArgs::from_view(view)?, cfg, WorkerId(0))?;
        Ok(())
    });
    let w = l4.start().expect("start");
    w.run(Orchestration::graph(move |g, _, _| {
        g.submit_next_level(setup, TaskArgs::new(), &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("setup run");
    let args = setup_args.lock().expect("args").clone().expect("set up");
    let a = args.clone();
    w.run(Orchestration::graph(move |g, _, _| {
        g.submit_next_level(forward, a.clone(), &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("run");
    assert_eq!(*graph_views.lock().expect("views"), vec![received(args.view())]);
    assert_eq!(chip_records(4), vec![received(args.view())]);
    w.close().expect("close");
}
