//! The code of `docs/guide.md`, verbatim, so that the guide keeps compiling and running.

#[test]
#[allow(unused_variables)] // the guide shows `add` registered, used in its next section
fn guide_one_chip() -> Result<(), Box<dyn std::error::Error>> {
    use simpler_device_a2a3::programs::add;
    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_worker::Worker;

    let mut b = Worker::chip(Platform::A2a3Sim, 0, RuntimeVariant::HostBuildGraph);
    let add = b.register_chip(add::callable()?);
    let worker = b.start()?; // attaches the chip and prepares `add` on it
    worker.close()?;
    Ok(())
}

#[test]
fn guide_l3_graph_with_a_sub_worker() -> Result<(), Box<dyn std::error::Error>> {
    use simpler_device_a2a3::programs::{add, f32_from_le_bytes, f32_to_le_bytes};
    use simpler_device_a2a3::{Platform, RuntimeVariant};
    use simpler_types::{CallConfig, DataType, TaskArgs, WorkerId};
    use simpler_worker::{HostBuffer, Orchestration, Worker};

    let mut b = Worker::host(Platform::A2a3Sim, RuntimeVariant::HostBuildGraph)
        .chips(&[0]) // chip 0 is device 0
        .sub_workers(1); // one host-closure thread
    let add = b.register_chip(add::callable()?);
    let check = b.register_host("check", |args| {
        // Tensor 0 is the chip's output; read it back from its host buffer.
        let out = args.tensor(0).and_then(HostBuffer::of_tensor).ok_or("no output")?;
        let f = f32_from_le_bytes(&out.to_vec());
        if f.iter().any(|&x| x != 3.0) {
            return Err("wrong result".into());
        }
        Ok(())
    });
    let worker = b.start()?;

    // Host buffers: the chip lane copies them to the chip and back around each chip task.
    let a = HostBuffer::from_bytes(&f32_to_le_bytes(&[1.0; 1024]))?;
    let bb = HostBuffer::from_bytes(&f32_to_le_bytes(&[2.0; 1024]))?;
    let f = HostBuffer::new(1024 * 4)?;

    worker.run(Orchestration::graph(move |g, _, _| {
        let t = |b: &HostBuffer| b.tensor(&[1024], DataType::Float32);
        let mut on_chip = TaskArgs::new();
        on_chip.add_input(t(&a)?)?.add_input(t(&bb)?)?.add_output(t(&f)?)?;
        g.submit_next_level(add, on_chip, &CallConfig::default(), WorkerId(0))?;
        // Reads what the chip task writes, so the engine runs it after the chip task.
        let mut on_host = TaskArgs::new();
        on_host.add_input(t(&f)?)?;
        g.submit_sub(check, on_host)?;
        Ok(())
    }))?;
    worker.close()?;
    Ok(())
}
