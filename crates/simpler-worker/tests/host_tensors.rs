//! Host buffers on L3 chip tasks: staged by the chip lane, ordered by the engine through their
//! tags like any tensor, and refused at submit where they cannot be staged.

mod common;

use common::{add_callable, host};
use simpler_device_a2a3::programs::{f32_from_le_bytes, f32_to_le_bytes};
use simpler_device_a2a3::{Platform, RuntimeVariant};
use std::sync::{Arc, Mutex};

use simpler_types::{CallConfig, DataType, TaskArgs, Tensor, WorkerId};
use simpler_worker::{BuildFailure, HostAddr, HostBuffer, Orchestration, Worker, WorkerError};

const N: u32 = 1024;

fn filled(values: &[f32]) -> HostBuffer {
    HostBuffer::from_bytes(&f32_to_le_bytes(values)).expect("buffer")
}

fn floats(b: &HostBuffer) -> Vec<f32> {
    f32_from_le_bytes(&b.to_vec())
}

fn t(b: &HostBuffer) -> Tensor {
    b.tensor(&[N], DataType::Float32).expect("tensor")
}

/// chip `f = a + b` → sub `g = 2f` → chip `h = g + b`, all through host buffers of one graph.
/// The sub task only sees the chip's result if the chip lane copied it back before the sub task
/// ran, and the second chip task only sees the sub task's result if the lane copied it in after.
#[test]
fn chip_then_host_then_chip_through_host_buffers_in_one_graph() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let add = b.register_chip(add_callable(0));
    let double = b.register_host("double", |args| {
        let input = args.tensor(0).and_then(HostBuffer::of_tensor).ok_or("input is no buffer")?;
        let output = args.tensor(1).and_then(HostBuffer::of_tensor).ok_or("output is no buffer")?;
        let doubled: Vec<f32> =
            f32_from_le_bytes(&input.to_vec()).iter().map(|x| 2.0 * x).collect();
        output.write(0, &f32_to_le_bytes(&doubled))?;
        Ok(())
    });
    let w = b.start().expect("start");
    let av: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..N).map(|i| 0.5 + (i % 7) as f32).collect();
    let (a, bb) = (filled(&av), filled(&bv));
    let [f, g, h] = [(); 3].map(|()| HostBuffer::new(N as usize * 4).expect("buffer"));
    for round in 0..3 {
        let [a, bb, f, g, h] = [&a, &bb, &f, &g, &h].map(HostBuffer::clone);
        let (f_out, h_out) = (f.clone(), h.clone());
        w.run(Orchestration::graph(move |gb, _, _| {
            let cfg = CallConfig::default();
            let mut first = TaskArgs::new();
            first.add_input(t(&a))?.add_input(t(&bb))?.add_output(t(&f))?;
            gb.submit_next_level(add, first, &cfg, WorkerId(0))?;
            let mut sub = TaskArgs::new();
            sub.add_input(t(&f))?.add_output(t(&g))?;
            gb.submit_sub(double, sub)?;
            let mut second = TaskArgs::new();
            second.add_input(t(&g))?.add_input(t(&bb))?.add_output(t(&h))?;
            gb.submit_next_level(add, second, &cfg, WorkerId(0))?;
            Ok(())
        }))
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let want: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| 2.0 * (x + y) + y).collect();
        assert_eq!(floats(&h_out), want, "round {round}");
        assert_eq!(floats(&f_out), av.iter().zip(&bv).map(|(x, y)| x + y).collect::<Vec<_>>());
    }
    w.close().expect("close");
}

/// Two views of one host buffer on one chip task share one device copy: the task reads one
/// half and writes the other, and the half it does not write comes back unchanged.
#[test]
fn views_of_one_host_buffer_share_one_staged_copy() {
    let mut b = host().chips(&[0]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let half = N / 2;
    let init: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let buf = filled(&init);
    let whole = t(&buf);
    let lo = whole.view(&[half], &[0]).expect("lo");
    let hi = whole.view(&[half], &[half]).expect("hi");
    // A buffer the task only writes, and only half of: its other half must survive as well.
    let other = filled(&init);
    let other_hi = t(&other).view(&[half], &[half]).expect("other hi");
    w.run(Orchestration::graph(move |g, _, _| {
        // hi = lo + lo, written blind: the untouched low half must survive the copy back.
        let mut args = TaskArgs::new();
        args.add_input(lo)?.add_input(lo)?.add_output(hi)?;
        g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
        let mut args = TaskArgs::new();
        args.add_input(lo)?.add_input(lo)?.add_output(other_hi)?;
        g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("run");
    let half = half as usize;
    let want: Vec<f32> = init[..half].iter().map(|x| x + x).collect();
    for got in [floats(&buf), floats(&other)] {
        assert_eq!(&got[..half], &init[..half]);
        assert_eq!(&got[half..], &want[..]);
    }
    w.close().expect("close");
}

/// A strided output view whose bounding span is the whole buffer still writes only part of
/// it: the buffer is copied in first, so the bytes in its gaps come back as they were.
#[test]
fn a_strided_output_over_a_whole_buffer_keeps_the_bytes_in_its_gaps() {
    let mut b = host().chips(&[0]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let out = filled(&[10.0, 20.0, 30.0, 40.0]);
    // Elements 0 and 3: the view spans all 16 bytes, with elements 1 and 2 in its gaps.
    let strided = out.tensor(&[4], DataType::Float32).unwrap().slice(0, 0, 4, 3).unwrap();
    let (a, bb) = (filled(&[1.0, 2.0]), filled(&[3.0, 4.0]));
    let ta = a.tensor(&[2], DataType::Float32).unwrap();
    let tb = bb.tensor(&[2], DataType::Float32).unwrap();
    w.run(Orchestration::graph(move |g, _, _| {
        let mut args = TaskArgs::new();
        args.add_input(ta)?.add_input(tb)?.add_output(strided)?;
        g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    }))
    .expect("run");
    // Whatever the kernel makes of the stride, element 2 lies in no element it may write.
    assert_eq!(floats(&out)[2], 30.0, "{:?}", floats(&out));
    w.close().expect("close");
}

/// An L4 task for a local L3 child whose host buffer the L4 graph drops right after submitting:
/// the run keeps it alive, so a buffer allocated next cannot take its address and be staged for
/// the child's chip task in its place.
#[test]
fn an_l4_run_keeps_the_host_buffers_of_its_child_tasks_alive() {
    let mut l3 = host().chips(&[0]);
    let add = l3.register_chip(add_callable(0));
    let mut l4 = Worker::composite(4);
    l4.child(l3).expect("adopt");
    let on_chip = l4.register_graph("on_chip", move |g, args, _| {
        let mut chip_args = TaskArgs::new();
        for (i, t) in args.tensors.iter().enumerate() {
            chip_args.add_tensor(*t, args.tags[i])?;
        }
        g.submit_next_level(add, chip_args, &CallConfig::default(), WorkerId(0))?;
        Ok(())
    });
    let w = l4.start().expect("start");
    let out = HostBuffer::new(N as usize * 4).expect("buffer");
    let tout = t(&out);
    let impostors = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&impostors);
    w.run(Orchestration::graph(move |g, _, _| {
        let ones = filled(&vec![1.0; N as usize]);
        let mut args = TaskArgs::new();
        args.add_input(t(&ones))?.add_input(t(&ones))?.add_output(tout)?;
        g.submit_next_level(on_chip, args, &CallConfig::default(), WorkerId(0))?;
        // Dropped here; had the run not kept it, the next buffer of its size could take its
        // address before the child's graph looks it up.
        drop(ones);
        keep.lock().unwrap().push(filled(&vec![9.0; N as usize]));
        Ok(())
    }))
    .expect("run");
    assert_eq!(floats(&out), vec![2.0; N as usize]);
    drop(impostors);
    w.close().expect("close");
}

/// Group members run at once, each staging its own copy: a member writing host bytes another
/// member reads or writes is refused at submit, naming both; disjoint parts of one buffer are
/// fine.
#[test]
fn group_members_sharing_written_host_bytes_are_refused_at_submit() {
    let mut b = host().chips(&[0, 1]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let input = filled(&vec![1.0; N as usize]);
    let out = HostBuffer::new(2 * N as usize * 4).expect("buffer");
    let whole = out.tensor(&[2 * N], DataType::Float32).unwrap();
    let halves = [whole.view(&[N], &[0]).unwrap(), whole.view(&[N], &[N]).unwrap()];
    let run = |outs: [Tensor; 2]| {
        let ti = t(&input);
        w.run(Orchestration::graph(move |g, _, _| {
            let members: Vec<TaskArgs> = outs
                .iter()
                .map(|o| {
                    let mut a = TaskArgs::new();
                    a.add_input(ti).unwrap().add_input(ti).unwrap().add_output(*o).unwrap();
                    a
                })
                .collect();
            g.submit_next_level_group(
                add,
                members,
                &CallConfig::default(),
                &[WorkerId(0), WorkerId(1)],
            )?;
            Ok(())
        }))
    };
    run(halves).expect("members writing disjoint halves of one buffer");
    assert_eq!(floats(&out), vec![2.0; 2 * N as usize]);
    let e = run([halves[0], halves[0]]).expect_err("two members writing the same half");
    let refused = std::error::Error::source(&e)
        .and_then(|s| {
            std::iter::successors(Some(s), |e| e.source())
                .find_map(|e| e.downcast_ref::<WorkerError>())
        })
        .map(|e| {
            matches!(
                e,
                WorkerError::HostTensorSharedInGroup { member: 0, arg: 2, other: 1, other_arg: 2 }
            )
        });
    assert_eq!(refused, Some(true), "{e}");
    w.close().expect("close");
}

/// Host memory that is not a `HostBuffer` is refused when the chip task is submitted, with an
/// error the graph callback can match (it keeps its type through `Build { cause }`).
#[test]
fn host_memory_that_is_not_a_host_buffer_is_refused_at_submit() {
    let mut b = host().chips(&[0]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let stray = Tensor::external(0x1000, &[N], DataType::Float32).expect("tensor");
    let out = HostBuffer::new(N as usize * 4).expect("buffer");
    let err = w
        .run(Orchestration::graph(move |g, _, _| {
            let mut args = TaskArgs::new();
            args.add_input(t(&out))?.add_input(stray)?.add_output(t(&out))?;
            g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect_err("refused");
    let WorkerError::Build { cause: BuildFailure::Callback(e), .. } = &err else {
        panic!("not a build failure of the callback: {err:?}");
    };
    match e.downcast_ref::<WorkerError>() {
        Some(WorkerError::HostTensorNotStaged { arg: 1, addr: HostAddr(0x1000), .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("HostBuffer::new"), "{err}");
    // The worker still runs graphs after the refusal.
    w.run(Orchestration::graph(|_, _, _| Ok(()))).expect("empty run");
    w.close().expect("close");
}

/// A sub task given chip memory is refused at submit with the hint to use a host buffer.
#[test]
fn chip_memory_on_a_sub_task_is_refused_at_submit_with_the_host_buffer_hint() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let noop = b.register_host("noop", |_| Ok(()));
    let w = b.start().expect("start");
    let dev = w.chip_memory(WorkerId(0)).expect("memory").malloc(u64::from(N) * 4).expect("malloc");
    let tensor = dev.tensor(&[N], DataType::Float32).expect("tensor");
    let err = w
        .run(Orchestration::graph(move |g, _, _| {
            let mut args = TaskArgs::new();
            args.add_input(tensor)?;
            g.submit_sub(noop, args)?;
            Ok(())
        }))
        .expect_err("refused");
    let WorkerError::Build { cause: BuildFailure::Callback(e), .. } = &err else {
        panic!("{err:?}");
    };
    assert!(matches!(
        e.downcast_ref::<WorkerError>(),
        Some(WorkerError::ChipMemoryOnSubTask { arg: 0 })
    ));
    assert!(err.to_string().contains("HostBuffer"), "{err}");
    w.chip_memory(WorkerId(0)).expect("memory").free(dev).expect("free");
    w.close().expect("close");
}

/// Two chip tasks of one graph write the two halves of one host buffer. The engine does not
/// order them (their spans are disjoint), so each chip lane may copy back only the half its task
/// wrote, or the later copy back returns the other half's stale bytes.
#[test]
fn two_chips_writing_disjoint_halves_of_one_host_buffer_both_land() {
    let mut b = host().chips(&[0, 1]);
    let adds = [b.register_chip(add_callable(0)), b.register_chip(add_callable(1))];
    let w = b.start().expect("start");
    let half = N / 2;
    let init: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let src = filled(&init);
    for round in 0..8 {
        let out = HostBuffer::new(N as usize * 4).expect("buffer");
        let (s, o) = (t(&src), t(&out));
        w.run(Orchestration::graph(move |g, _, _| {
            for (chip, add) in adds.iter().enumerate() {
                let off = [half * chip as u32];
                let (x, y) = (s.view(&[half], &off)?, o.view(&[half], &off)?);
                let mut args = TaskArgs::new();
                args.add_input(x)?.add_input(x)?.add_output(y)?;
                g.submit_next_level(*add, args, &CallConfig::default(), WorkerId(chip as u32))?;
            }
            Ok(())
        }))
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(floats(&out), init.iter().map(|x| x + x).collect::<Vec<_>>(), "round {round}");
    }
    w.close().expect("close");
}

/// A chip task writes the low half of a host buffer while a sub task writes the high half: the
/// chip lane's copy back must not return the high half as it was before the sub task.
#[test]
fn a_chip_and_a_sub_task_writing_disjoint_halves_of_one_host_buffer_both_land() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let add = b.register_chip(add_callable(0));
    let half = N / 2;
    let fill = b.register_host("fill high half", move |args| {
        let out = args.tensor(0).and_then(HostBuffer::of_tensor).ok_or("output is no buffer")?;
        // Give the chip lane time to stage its copy before this half is written.
        std::thread::sleep(std::time::Duration::from_millis(5));
        out.write(u64::from(half) * 4, &f32_to_le_bytes(&vec![-1.0; half as usize]))?;
        Ok(())
    });
    let w = b.start().expect("start");
    let init: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let src = filled(&init);
    for round in 0..4 {
        let out = HostBuffer::new(N as usize * 4).expect("buffer");
        let (s, o) = (t(&src), t(&out));
        w.run(Orchestration::graph(move |g, _, _| {
            let mut sub = TaskArgs::new();
            sub.add_output(o.view(&[half], &[half])?)?;
            g.submit_sub(fill, sub)?;
            let x = s.view(&[half], &[0])?;
            let mut args = TaskArgs::new();
            args.add_input(x)?.add_input(x)?.add_output(o.view(&[half], &[0])?)?;
            g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let got = floats(&out);
        let h = half as usize;
        assert_eq!(&got[..h], &init[..h].iter().map(|x| x + x).collect::<Vec<_>>()[..]);
        assert_eq!(&got[h..], &vec![-1.0; h][..], "round {round}");
    }
    w.close().expect("close");
}

/// A tensor whose base address is inside a host buffer but not at its start would not be
/// ordered against the buffer's other views; it is refused at submit.
#[test]
fn a_tensor_based_inside_a_host_buffer_is_refused_at_submit() {
    let mut b = host().chips(&[0]).sub_workers(1);
    let add = b.register_chip(add_callable(0));
    let noop = b.register_host("noop", |_| Ok(()));
    let w = b.start().expect("start");
    let buf = HostBuffer::new(N as usize * 8).expect("buffer");
    let inner = Tensor::with_buffer(buf.addr() + 64, u64::from(N) * 4, &[N], DataType::Float32)
        .expect("tensor")
        .child_memory(false);
    for on_chip in [true, false] {
        let (whole, inner) = (buf.tensor(&[N], DataType::Float32).expect("tensor"), inner);
        let err = w
            .run(Orchestration::graph(move |g, _, _| {
                let mut args = TaskArgs::new();
                args.add_input(whole)?.add_input(whole)?.add_output(inner)?;
                if on_chip {
                    g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
                } else {
                    g.submit_sub(noop, args)?;
                }
                Ok(())
            }))
            .expect_err("refused");
        let WorkerError::Build { cause: BuildFailure::Callback(e), .. } = &err else {
            panic!("{err:?}");
        };
        match e.downcast_ref::<WorkerError>() {
            Some(WorkerError::HostTensorOffsetBase { arg: 2, addr, buffer })
                if *addr == buf.addr() + 64 && *buffer == buf.addr() => {}
            other => panic!("on chip {on_chip}: {other:?}"),
        }
        assert!(err.to_string().contains("HostBuffer::tensor"), "{err}");
    }
    w.close().expect("close");
}

/// A host buffer tagged `NoDep` on a chip task is refused at submit: the lane could not tell
/// whether the chip writes it (a write would be dropped silently).
#[test]
fn a_host_buffer_tagged_no_dep_on_a_chip_task_is_refused_at_submit() {
    let mut b = host().chips(&[0]);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let (src, out) = (filled(&[1.0; N as usize]), HostBuffer::new(N as usize * 4).expect("buffer"));
    let (s, o) = (t(&src), t(&out));
    let err = w
        .run(Orchestration::graph(move |g, _, _| {
            let mut args = TaskArgs::new();
            args.add_input(s)?.add_input(s)?.add_no_dep(o)?;
            g.submit_next_level(add, args, &CallConfig::default(), WorkerId(0))?;
            Ok(())
        }))
        .expect_err("refused");
    let WorkerError::Build { cause: BuildFailure::Callback(e), .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        matches!(e.downcast_ref::<WorkerError>(), Some(WorkerError::HostTensorNoDep { arg: 2 })),
        "{err:?}"
    );
    assert!(err.to_string().contains("tag it Input, Output or InOut"), "{err}");
    w.close().expect("close");
}

/// A sub task's host buffer stays alive until the run is published, even when the graph
/// callback dropped its own handle right after the submit: the sub task still finds it.
#[test]
fn a_sub_tasks_host_buffer_outlives_the_callbacks_handle() {
    let mut b = host().sub_workers(1);
    let check = b.register_host("check", |args| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let buf = args.tensor(0).and_then(HostBuffer::of_tensor).ok_or("buffer gone")?;
        if floats(&buf) != vec![3.0; N as usize] {
            return Err("another buffer's bytes".into());
        }
        Ok(())
    });
    let w = b.start().expect("start");
    for round in 0..3 {
        w.run(Orchestration::graph(move |g, _, _| {
            let buf = filled(&[3.0; N as usize]);
            let mut args = TaskArgs::new();
            args.add_inout(t(&buf))?.add_input(t(&buf))?;
            g.submit_sub(check, args)?;
            drop(buf);
            Ok(())
        }))
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    w.close().expect("close");
}

/// An L2 run naming host memory (a HostBuffer or any other) is refused at submit with a hint
/// the L2 caller can act on (chip memory, or an L3 graph), and the worker keeps running.
#[test]
fn host_memory_on_an_l2_chip_run_is_refused_at_submit_with_an_l2_hint() {
    let mut b = Worker::chip(Platform::A2a3Sim, 5, RuntimeVariant::HostBuildGraph);
    let add = b.register_chip(add_callable(0));
    let w = b.start().expect("start");
    let host = filled(&[1.0; N as usize]);
    let mem = w.memory().expect("l2 memory");
    let bufs: Vec<_> = (0..2).map(|_| mem.malloc(u64::from(N) * 4).expect("malloc")).collect();
    let mut args = TaskArgs::new();
    args.add_input(bufs[0].tensor(&[N], DataType::Float32).unwrap()).unwrap();
    args.add_input(t(&host)).unwrap();
    args.add_output(bufs[1].tensor(&[N], DataType::Float32).unwrap()).unwrap();
    let err = w.submit(Orchestration::chip(add, args)).expect_err("refused");
    assert!(
        matches!(err, WorkerError::HostTensorAtL2 { arg: 1, addr } if addr == host.addr()),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("Worker::memory") && text.contains("HostBuffer"), "{text}");
    assert!(!text.contains("with_host_tensors"), "names an API the L2 caller cannot reach: {text}");
    // The same run on chip memory only still works.
    let dev = |i: usize| bufs[i].tensor(&[N], DataType::Float32).unwrap();
    let mut args = TaskArgs::new();
    args.add_input(dev(0)).unwrap().add_input(dev(0)).unwrap().add_output(dev(1)).unwrap();
    w.run(Orchestration::chip(add, args)).expect("chip-memory run");
    for buf in bufs {
        mem.free(buf).expect("free");
    }
    w.close().expect("close");
}
