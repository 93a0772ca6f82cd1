//! The loader and the bindings against the stand-in CANN library, laid out as fake installs.

use std::ffi::c_void;
use std::path::PathBuf;
use std::ptr;

use simpler_acl_sys::standin::{Call, FakeInstall, ObjectKind};
use simpler_acl_sys::types::*;
use simpler_acl_sys::{Candidate, Cann, Library, LoadError};

fn found(cann: &Cann, library: Library) -> PathBuf {
    match cann.open(library) {
        Ok(Candidate::Path(path)) => path.clone(),
        other => panic!("{library} not found as a path: {other:?}"),
    }
}

#[test]
fn default_install_root_is_found_and_the_driver_comes_from_the_driver_directory() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let root = install.root();
    assert_eq!(found(&cann, Library::Acl), root.join("usr/local/Ascend/cann/lib64/libascendcl.so"));
    assert_eq!(
        found(&cann, Library::Hal),
        root.join("usr/local/Ascend/driver/lib64/driver/libascend_hal.so")
    );
}

#[test]
fn search_order_lib_dir_then_ascend_home_then_install_info_then_default_roots() {
    let arch_lib = format!("opt/home/{}-linux/lib64", std::env::consts::ARCH);
    let mut install = FakeInstall::standard().unwrap();
    install.place(Library::Acl, &arch_lib).unwrap();
    install.place(Library::Acl, "opt/info/lib64").unwrap();
    install.place(Library::Acl, "opt/libdir").unwrap();
    std::fs::create_dir_all(install.root().join("etc/Ascend")).unwrap();
    let info_file = install.root().join("etc/Ascend/ascend_cann_install.info");
    let info = format!("Install_Path={}\n", install.root().join("opt/info").display());
    std::fs::write(&info_file, info).unwrap();
    let root = install.root().to_path_buf();
    let with = |vars: &[(&str, &str)]| {
        // SAFETY: every variable names a directory of the install, and the install's root holds
        // only stand-in copies (and the info file naming `opt/info`, inside it too).
        found(&unsafe { Cann::new(install.config_with_env(vars)) }, Library::Acl)
    };

    assert_eq!(with(&[]), root.join("opt/info/lib64/libascendcl.so"));
    assert_eq!(
        with(&[("ASCEND_TOOLKIT_HOME", "@/opt/home")]),
        root.join(&arch_lib).join("libascendcl.so")
    );
    assert_eq!(
        with(&[("ASCEND_HOME_PATH", "@/opt/home")]),
        root.join(&arch_lib).join("libascendcl.so")
    );
    assert_eq!(
        with(&[("ASCEND_HOME_PATH", "@/opt/home"), ("SIMPLER_ASCEND_LIB_DIR", "@/opt/libdir")]),
        root.join("opt/libdir/libascendcl.so")
    );
    // An empty variable counts as unset.
    assert_eq!(with(&[("SIMPLER_ASCEND_LIB_DIR", "")]), root.join("opt/info/lib64/libascendcl.so"));
    // Without the info file the default root is next.
    std::fs::remove_file(&info_file).unwrap();
    assert_eq!(with(&[]), root.join("usr/local/Ascend/cann/lib64/libascendcl.so"));
}

#[test]
fn the_install_info_file_under_etc_comes_before_the_one_under_home() {
    let mut install = FakeInstall::standard().unwrap();
    install.place(Library::Runtime, "opt/from-etc/lib64").unwrap();
    install.place(Library::Runtime, "opt/from-home/runtime/lib64").unwrap();
    let root = install.root().to_path_buf();
    let write_info = |file: &str, target: &str| {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("# CANN\nInstall_Path = {}\n", root.join(target).display()))
            .unwrap();
    };
    write_info("home/user/Ascend/ascend_cann_install.info", "opt/from-home");
    // SAFETY: `HOME` and both info files name directories of the install, which holds only
    // stand-in copies.
    let cann = || unsafe { Cann::new(install.config_with_env(&[("HOME", "@/home/user")])) };
    assert_eq!(
        found(&cann(), Library::Runtime),
        root.join("opt/from-home/runtime/lib64/libruntime.so")
    );
    write_info("etc/Ascend/ascend_cann_install.info", "opt/from-etc");
    assert_eq!(found(&cann(), Library::Runtime), root.join("opt/from-etc/lib64/libruntime.so"));
}

#[test]
fn the_candidates_follow_the_documented_order() {
    let install = FakeInstall::empty().unwrap();
    let root = install.root();
    let config = install
        .config_with_env(&[
            ("SIMPLER_ASCEND_LIB_DIR", "/lib-dir"),
            ("ASCEND_HOME_PATH", "/home-path"),
        ])
        .already_loaded(true)
        .soname_fallback(true);
    let arch = std::env::consts::ARCH;
    let path = |p: String| Candidate::Path(PathBuf::from(p));
    let r = |p: &str| Candidate::Path(root.join(p));
    let expected = vec![
        Candidate::Loaded("libascend_hal.so"),
        path("/lib-dir/libascend_hal.so".into()),
        path("/home-path/lib64/libascend_hal.so".into()),
        path(format!("/home-path/{arch}-linux/lib64/libascend_hal.so")),
        path("/home-path/runtime/lib64/libascend_hal.so".into()),
        r("usr/local/Ascend/cann/lib64/libascend_hal.so"),
        r(&format!("usr/local/Ascend/cann/{arch}-linux/lib64/libascend_hal.so")),
        r("usr/local/Ascend/cann/runtime/lib64/libascend_hal.so"),
        r("usr/local/Ascend/ascend-toolkit/latest/lib64/libascend_hal.so"),
        r(&format!("usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/lib64/libascend_hal.so")),
        r("usr/local/Ascend/ascend-toolkit/latest/runtime/lib64/libascend_hal.so"),
        r("usr/local/Ascend/driver/lib64/driver/libascend_hal.so"),
        r("usr/local/Ascend/driver/lib64/libascend_hal.so"),
        Candidate::Soname("libascend_hal.so"),
    ];
    assert_eq!(config.candidates(Library::Hal), expected);
    // Libraries with two names try both in each place.
    let dlog = config.candidates(Library::Dlog);
    assert_eq!(dlog[2], path("/lib-dir/libunified_dlog.so".into()));
    assert_eq!(dlog[3], path("/lib-dir/libascendalog.so".into()));
}

#[test]
fn many_threads_resolving_on_first_use_at_once_all_succeed_and_open_each_library_once() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    const THREADS: usize = 8;
    // Each thread starts with another function of the same library, so the threads race for
    // the library slot as well as for the function slots.
    let calls: [&(dyn Fn(&Cann) -> i32 + Sync); 4] = [
        // SAFETY: a valid device id.
        &|c| unsafe { c.aclrtSetDevice(0) }.unwrap(),
        // SAFETY: a valid out-pointer.
        &|c| unsafe { c.aclrtGetDeviceCount(&mut 0) }.unwrap(),
        // SAFETY: valid out-pointers.
        &|c| unsafe { c.aclrtGetVersion(&mut 0, &mut 0, &mut 0) }.unwrap(),
        // SAFETY: a valid out-pointer.
        &|c| unsafe { c.aclrtSetOpExecuteTimeOutV2(1000, &mut 0) }.unwrap(),
    ];
    let barrier = std::sync::Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (cann, barrier, calls) = (&cann, &barrier, &calls);
            s.spawn(move || {
                barrier.wait();
                for i in 0..calls.len() {
                    assert_eq!(calls[(t + i) % calls.len()](cann), 0);
                }
            });
        }
    });
    let log = install.take_log().unwrap();
    assert_eq!(log.len(), 4 * THREADS);
    assert!(log.iter().all(|c| c.ret == 0));
    assert!(cann.probe().is_ok());
}

#[test]
fn a_missing_library_lists_every_path_tried_with_its_error() {
    let mut install = FakeInstall::empty().unwrap();
    install.place(Library::Runtime, "usr/local/Ascend/cann/lib64").unwrap();
    let config = install.config_with_env(&[("ASCEND_HOME_PATH", "@/nowhere")]);
    let expected = config.candidates(Library::Acl);
    // SAFETY: the search reaches only the install (which holds only stand-in copies) and a
    // directory of it that does not exist.
    let cann = unsafe { Cann::new(config) };
    // SAFETY: a valid device id; no pointers.
    let err = unsafe { cann.aclrtSetDevice(0) }.unwrap_err();
    let LoadError::Library { library, tried } = &err else { panic!("{err:?}") };
    assert_eq!(*library, Library::Acl);
    let tried_candidates: Vec<_> = tried.iter().map(|a| a.candidate.clone()).collect();
    assert_eq!(tried_candidates, expected);
    assert!(tried.iter().all(|a| a.error == "no such file"), "{tried:?}");
    let message = err.to_string();
    assert!(message.starts_with("libascendcl.so not found; tried: "), "{message}");
    assert!(
        message
            .contains(&install.root().join("nowhere/lib64/libascendcl.so").display().to_string())
    );
    assert!(message.contains(
        &install.root().join("usr/local/Ascend/cann/lib64/libascendcl.so").display().to_string()
    ));
    // The runtime library is there and still works.
    // SAFETY: a valid device id.
    assert_eq!(unsafe { cann.rtSetDevice(0) }, Ok(0));
}

#[test]
fn a_file_that_is_not_a_library_reports_dlerror() {
    let install = FakeInstall::empty().unwrap();
    let dir = install.root().join("usr/local/Ascend/cann/lib64");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("libascendcl.so"), b"not an ELF file").unwrap();
    let cann = install.cann();
    let err = cann.open(Library::Acl).unwrap_err();
    let LoadError::Library { tried, .. } = &err else { panic!("{err:?}") };
    let attempt =
        tried.iter().find(|a| a.candidate == Candidate::Path(dir.join("libascendcl.so"))).unwrap();
    assert!(attempt.error.contains("libascendcl.so"), "dlerror names the file: {}", attempt.error);
    assert_ne!(attempt.error, "no such file");
}

#[test]
fn libraries_open_on_first_use_and_a_missing_symbol_fails_only_its_call() {
    let install = FakeInstall::standard_omitting(Some("aclrtGetSocName")).unwrap();
    let cann = install.cann();
    assert!(Library::ALL.iter().all(|l| cann.library_source(*l).is_none()), "nothing opened yet");
    // SAFETY: a valid device id.
    assert_eq!(unsafe { cann.aclrtSetDevice(0) }, Ok(0));
    assert!(cann.library_source(Library::Acl).is_some());
    assert!(cann.library_source(Library::Runtime).is_none(), "only the library used is opened");

    // SAFETY: no arguments.
    let err = unsafe { cann.aclrtGetSocName() }.unwrap_err();
    let LoadError::Symbol { library, symbol, from, .. } = &err else { panic!("{err:?}") };
    assert_eq!((*library, *symbol), (Library::Acl, "aclrtGetSocName"));
    assert!(from.ends_with("usr/local/Ascend/cann/lib64/libascendcl.so"), "{from}");
    assert!(
        err.to_string().starts_with("aclrtGetSocName is not exported by libascendcl.so"),
        "{err}"
    );
    // The failure is kept and other functions go on working.
    // SAFETY: no arguments.
    assert_eq!(unsafe { cann.aclrtGetSocName() }.unwrap_err(), err);
    // SAFETY: null config path is allowed.
    assert_eq!(unsafe { cann.aclInit(ptr::null()) }, Ok(0));
    // Probe succeeds: the missing function is optional.
    assert!(cann.probe().is_ok());
    // A feature that needs it asks for it by name and gets every problem at once.
    assert_eq!(cann.require(&["aclInit", "aclrtSetDevice"]), Ok(()));
    let Err(LoadError::Incomplete { missing }) =
        cann.require(&["aclInit", "aclrtGetSocName", "noSuchFunction"])
    else {
        panic!("missing functions were not reported")
    };
    assert_eq!(missing.len(), 2, "{missing:?}");
    assert_eq!(missing[0], err);
    assert_eq!(missing[1], LoadError::Unlisted { symbol: "noSuchFunction".into() });
}

#[test]
fn probe_does_not_require_functions_nothing_calls_yet() {
    for symbol in ["rtGetC2cCtrlAddr", "halGetDeviceInfo"] {
        let install = FakeInstall::standard_omitting(Some(symbol)).unwrap();
        assert!(install.cann().probe().is_ok(), "{symbol}");
    }
}

#[test]
fn probe_reports_every_missing_required_symbol_and_library_at_once() {
    let mut install = FakeInstall::empty_omitting(Some("rtsLaunchCpuKernel")).unwrap();
    install.place(Library::Acl, "usr/local/Ascend/cann/lib64").unwrap();
    install.place(Library::Runtime, "usr/local/Ascend/cann/lib64").unwrap();
    // No driver library at all.
    let cann = install.cann();
    let err = cann.probe().unwrap_err();
    let LoadError::Incomplete { missing } = &err else { panic!("{err:?}") };
    assert_eq!(missing.len(), 2, "{missing:#?}");
    assert!(
        matches!(missing[0], LoadError::Symbol { symbol: "rtsLaunchCpuKernel", .. }),
        "{missing:?}"
    );
    assert!(matches!(missing[1], LoadError::Library { library: Library::Hal, .. }), "{missing:?}");
    let message = err.to_string();
    assert!(
        message.contains("rtsLaunchCpuKernel") && message.contains("libascend_hal.so not found")
    );
}

#[test]
fn probe_reports_where_each_library_came_from_and_the_version() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let probe = cann.probe().unwrap();
    let libraries: Vec<_> = probe.libraries.iter().map(|(l, _)| *l).collect();
    assert_eq!(libraries, [Library::Acl, Library::Runtime, Library::Hal]);
    assert_eq!(probe.version.map(|v| v.to_string()), Some("8.2.0".to_owned()));
    assert!(probe.version_supported());
    install.set_value("version_major", 9).unwrap();
    let probe = cann.probe().unwrap();
    assert_eq!(probe.version.map(|v| v.major), Some(9));
    assert!(!probe.version_supported());
}

#[test]
fn the_soc_name_is_an_a2_by_default_and_follows_its_knob_including_no_name() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let name = || cann.soc_name().unwrap();
    assert_eq!(name().as_deref(), Some("Ascend910B1"));
    for (knob, want) in
        [(1, Some("Ascend910_9391")), (2, Some("Ascend950PR_9599")), (3, None), (-1, None)]
    {
        install.set_value("soc_name", knob).unwrap();
        assert_eq!(name().as_deref(), want, "knob {knob}");
    }
    let calls = install.take_calls().unwrap();
    assert_eq!(&calls[..3], ["aclInit", "aclrtGetSocName", "aclFinalize"]);
    assert!(!calls.iter().any(|c| c.starts_with("aclrtSetDevice")), "{calls:?}");
}

#[test]
fn acl_errors_carry_name_meaning_and_cann_recent_message() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let mut stream: aclrtStream = ptr::null_mut();
    // SAFETY: a valid device id; `stream` is a valid out-pointer.
    assert_eq!(unsafe { cann.aclrtSetDevice(0) }, Ok(0));
    // SAFETY: as above.
    assert_eq!(unsafe { cann.aclrtCreateStream(&mut stream) }, Ok(0));
    install
        .fail_call("aclrtSynchronizeStreamWithTimeout", 1, ACL_ERROR_RT_STREAM_SYNC_TIMEOUT)
        .unwrap();
    // SAFETY: a live stream handle.
    let code = unsafe { cann.aclrtSynchronizeStreamWithTimeout(stream, 4000) }.unwrap();
    let err = cann.check("aclrtSynchronizeStreamWithTimeout", code).unwrap_err();
    assert_eq!((err.code, err.name), (507046, "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT"));
    assert_eq!(
        err.to_string(),
        "aclrtSynchronizeStreamWithTimeout: 507046 ACL_ERROR_RT_STREAM_SYNC_TIMEOUT (the host \
         timed out waiting for the stream); CANN says: stand-in: \
         aclrtSynchronizeStreamWithTimeout returned 507046: injected fault"
    );
    // Only the first call was injected.
    // SAFETY: a live stream handle.
    assert_eq!(unsafe { cann.aclrtSynchronizeStreamWithTimeout(stream, 4000) }, Ok(0));
    assert!(cann.check("aclrtSynchronizeStreamWithTimeout", 0).is_ok());
}

#[test]
fn every_named_code_has_a_name_and_meaning_and_unknown_codes_say_so() {
    for (code, name, meaning) in simpler_acl_sys::ERROR_NAMES {
        assert!(name.starts_with("ACL_ERROR_") && !meaning.is_empty());
        assert_eq!(simpler_acl_sys::error_name(*code), (*name, *meaning));
    }
    assert!(simpler_acl_sys::error_name(507899).1.contains("symptom of an earlier"));
    // The codes a bad device id or a thread with no device bound get.
    assert_eq!(simpler_acl_sys::error_name(107001).0, "ACL_ERROR_RT_INVALID_DEVICEID");
    assert_eq!(simpler_acl_sys::error_name(107002).0, "ACL_ERROR_RT_CONTEXT_NULL");
    let err = simpler_acl_sys::AclError::new("rtMalloc", 12345, None);
    assert_eq!(err.to_string(), "rtMalloc: 12345 UNKNOWN (a code simpler has no name for)");
}

/// Writes the AICPU op description the stand-in's `rtsBinaryLoadFromFile` reads.
fn op_json(install: &FakeInstall, ops: &[&str]) -> std::ffi::CString {
    let entries: Vec<String> = ops
        .iter()
        .map(|op| format!(r#"{{"opType": "{op}", "functionName": "{op}", "kernelSo": "libx.so"}}"#))
        .collect();
    let path = install.root().join("ops.json");
    std::fs::write(&path, format!("[{}]", entries.join(","))).unwrap();
    std::ffi::CString::new(path.to_str().unwrap()).unwrap()
}

#[test]
fn a_representative_init_and_run_sequence_is_logged_in_order_with_its_arguments() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let json = op_json(&install, &["simpler_aicpu_init_1", "simpler_aicpu_exec_1"]);
    let elf = [0x7fu8, b'E', b'L', b'F'];
    let input: Vec<u8> = (0..=255).collect();
    let mut output = vec![0u8; 256];
    // SAFETY: every pointer below is valid for the call it is passed to; handles come from
    // the calls that created them.
    unsafe {
        assert_eq!(cann.dlog_setlevel(-1, 3, 0), Ok(0));
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        let (mut aicpu, mut aicore): (rtStream_t, rtStream_t) = (ptr::null_mut(), ptr::null_mut());
        assert_eq!(cann.rtStreamCreate(&mut aicpu, 0), Ok(0));
        assert_eq!(cann.rtStreamCreate(&mut aicore, 0), Ok(0));
        let mut cube = 0u32;
        assert_eq!(cann.aclrtGetStreamResLimit(aicore, ACL_RT_DEV_RES_CUBE_CORE, &mut cube), Ok(0));
        assert_eq!(cube, 24);

        let mut dev: *mut c_void = ptr::null_mut();
        assert_eq!(cann.rtMalloc(&mut dev, 256, RT_MEMORY_HBM, 0), Ok(0));
        assert_eq!(
            cann.rtMemcpy(dev, 256, input.as_ptr().cast(), 256, RT_MEMCPY_HOST_TO_DEVICE),
            Ok(0)
        );
        assert_eq!(
            cann.rtMemcpy(output.as_mut_ptr().cast(), 256, dev, 256, RT_MEMCPY_DEVICE_TO_HOST),
            Ok(0)
        );
        assert_eq!(output, input, "device memory round-trips");
        // Out of range: one byte past the allocation.
        assert_eq!(
            cann.rtMemcpy(
                dev.cast::<u8>().add(1).cast(),
                256,
                input.as_ptr().cast(),
                256,
                RT_MEMCPY_HOST_TO_DEVICE
            ),
            Ok(107000)
        );

        let bin = rtDevBinary_t {
            magic: RT_DEV_BINARY_MAGIC_ELF,
            version: 0,
            data: elf.as_ptr().cast(),
            length: elf.len() as u64,
        };
        let mut kernel: *mut c_void = ptr::null_mut();
        assert_eq!(cann.rtRegisterAllKernel(&bin, &mut kernel), Ok(0));

        let mut option = rtLoadBinaryOption_t {
            optionId: RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE,
            value: rtLoadBinaryOptionValue_t { cpuKernelMode: 0 },
        };
        let config = rtLoadBinaryConfig_t { options: &mut option, numOpt: 1 };
        let mut binary: rtBinHandle = ptr::null_mut();
        assert_eq!(cann.rtsBinaryLoadFromFile(json.as_ptr(), &config, &mut binary), Ok(0));
        let mut exec: rtFuncHandle = ptr::null_mut();
        assert_eq!(
            cann.rtsFuncGetByName(binary, c"simpler_aicpu_exec_1".as_ptr(), &mut exec),
            Ok(0)
        );
        assert_eq!(
            cann.rtsFuncGetByName(binary, c"missing".as_ptr(), &mut exec.clone()),
            Ok(107000)
        );

        let mut kernel_args = dev;
        let mut args = rtArgsEx_t {
            args: (&raw mut kernel_args).cast(),
            hostInputInfoPtr: ptr::null_mut(),
            argsSize: 8,
            tilingAddrOffset: 0,
            tilingDataOffset: 0,
            hostInputInfoNum: 0,
            hasTiling: 0,
            isNoNeedH2DCopy: 0,
            reserved: [0; 4],
        };
        let cfg = rtTaskCfgInfo_t { schemMode: RT_SCHEM_MODE_BATCH as u8, ..Default::default() };
        assert_eq!(
            cann.rtKernelLaunchWithHandleV2(
                kernel,
                0,
                24,
                &mut args,
                ptr::null_mut(),
                aicore,
                &cfg
            ),
            Ok(0)
        );
        let mut cpu_args: rtCpuKernelArgs_t = Default::default();
        cpu_args.baseArgs.argsSize = 64;
        assert_eq!(cann.rtsLaunchCpuKernel(exec, 4, aicpu, ptr::null(), &mut cpu_args), Ok(0));
        assert_eq!(cann.aclrtSynchronizeStreamWithTimeout(aicpu, 4000), Ok(0));
        assert_eq!(cann.aclrtSynchronizeStreamWithTimeout(aicore, 4000), Ok(0));

        assert_eq!(cann.rtStreamDestroy(aicore), Ok(0));
        assert_eq!(cann.rtStreamDestroy(aicpu), Ok(0));
        assert_eq!(cann.rtsBinaryUnload(binary), Ok(0));
        assert_eq!(install.live(ObjectKind::Allocations).unwrap(), 1);
        assert_eq!(cann.rtFree(dev), Ok(0));
        assert_eq!(install.live(ObjectKind::Allocations).unwrap(), 0);
        assert_eq!(cann.rtFree(dev), Ok(107000), "double free is refused");
    }
    let log = install.take_log().unwrap();
    let funcs: Vec<&str> = log.iter().map(|c| c.func.as_str()).collect();
    assert_eq!(
        funcs,
        [
            "dlog_setlevel",
            "rtSetDevice",
            "rtStreamCreate",
            "rtStreamCreate",
            "aclrtGetStreamResLimit",
            "rtMalloc",
            "rtMemcpy",
            "rtMemcpy",
            "rtMemcpy",
            "rtRegisterAllKernel",
            "rtsBinaryLoadFromFile",
            "rtsFuncGetByName",
            "rtsFuncGetByName",
            "rtKernelLaunchWithHandleV2",
            "rtsLaunchCpuKernel",
            "aclrtSynchronizeStreamWithTimeout",
            "aclrtSynchronizeStreamWithTimeout",
            "rtStreamDestroy",
            "rtStreamDestroy",
            "rtsBinaryUnload",
            "rtFree",
            "rtFree",
        ]
    );
    let (aicpu, aicore) = (log[2].stream.unwrap(), log[3].stream.unwrap());
    assert_ne!(aicpu, aicore);
    assert_eq!(log[0].value, Some(3), "log level");
    assert_eq!(log[1].device, Some(0));
    assert_eq!((log[4].stream, log[4].value), (Some(aicore), Some(0)));
    assert_eq!((log[5].size, log[5].ret), (Some(256), 0));
    assert_eq!((log[6].size, log[6].value), (Some(256), Some(1)), "H2D");
    assert_eq!(log[8].ret, 107000);
    assert_eq!(log[10].size, Some(2), "two ops parsed from the JSON");
    assert_eq!(log[10].value, Some(0), "CPU kernel mode");
    assert_eq!(log[11].text, "simpler_aicpu_exec_1");
    let launch = &log[13];
    assert_eq!(
        (launch.stream, launch.block_dim, launch.size, launch.value),
        (Some(aicore), Some(24), Some(8), Some(1))
    );
    let cpu = &log[14];
    assert_eq!(
        (cpu.stream, cpu.block_dim, cpu.text.as_str()),
        (Some(aicpu), Some(4), "simpler_aicpu_exec_1")
    );
    assert_eq!((log[15].stream, log[15].timeout), (Some(aicpu), Some(4000)));
    assert_eq!((log[16].stream, log[16].timeout), (Some(aicore), Some(4000)));
    assert!(install.take_log().unwrap().is_empty(), "taking the log empties it");
}

#[test]
fn the_nth_call_fails_with_the_chosen_code_and_the_others_succeed() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.fail_call("rtMalloc", 2, ACL_ERROR_RT_MEMORY_ALLOCATION).unwrap();
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: plain integer argument.
    assert_eq!(unsafe { cann.rtSetDevice(0) }, Ok(0));
    // SAFETY: valid out-pointers.
    let codes: Vec<i32> =
        (0..3).map(|_| unsafe { cann.rtMalloc(&mut p, 64, RT_MEMORY_HBM, 0) }.unwrap()).collect();
    assert_eq!(codes, [0, 207001, 0]);
    assert_eq!(
        install.live(ObjectKind::Allocations).unwrap(),
        2,
        "the failed call allocated nothing"
    );
    let rets: Vec<i64> = install.take_log().unwrap().iter().map(|c| c.ret).collect();
    assert_eq!(rets, [0, 0, 207001, 0], "the bind, then the three allocations");
}

#[test]
fn sync_timeout_hits_only_the_chosen_stream() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.set_value("sync_timeout_stream", 2).unwrap();
    let (mut first, mut second): (rtStream_t, rtStream_t) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid out-pointers and live handles.
    unsafe {
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.rtStreamCreate(&mut first, 0), Ok(0));
        assert_eq!(cann.rtStreamCreate(&mut second, 0), Ok(0));
        assert_eq!(cann.aclrtSynchronizeStreamWithTimeout(first, 100), Ok(0));
        assert_eq!(cann.aclrtSynchronizeStreamWithTimeout(second, 100), Ok(507046));
    }
}

#[test]
fn poison_is_sticky_until_force_reset_and_the_reset_probe_fails_k_times() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    install.poison_at("rtKernelLaunchWithHandleV2", 1, ACL_ERROR_RT_AICORE_EXCEPTION).unwrap();
    install.set_value("reset_probe_failures", 2).unwrap();
    let mut stream: rtStream_t = ptr::null_mut();
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: valid out-pointers; the launch fails before it reads its arguments.
    unsafe {
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.rtStreamCreate(&mut stream, 0), Ok(0));
        let code = cann.rtKernelLaunchWithHandleV2(
            ptr::null_mut(),
            0,
            1,
            ptr::null_mut(),
            ptr::null_mut(),
            stream,
            ptr::null(),
        );
        assert_eq!(code, Ok(507015));
        assert_eq!(cann.rtMalloc(&mut p, 64, RT_MEMORY_HBM, 0), Ok(507899));
        assert_eq!(cann.rtStreamDestroy(stream), Ok(507899));
        assert_eq!(cann.aclrtSynchronizeDeviceWithTimeout(1000), Ok(507899));
        // The force-reset loop: reset, probe (create a stream); twice the probe fails. A
        // retry sets the device again: the reset before it released it.
        let mut probes = Vec::new();
        for attempt in 0..3 {
            if attempt > 0 {
                assert_eq!(cann.rtSetDevice(0), Ok(0));
            }
            assert_eq!(cann.aclrtResetDeviceForce(0), Ok(0));
            let mut probe: aclrtStream = ptr::null_mut();
            let code = cann.aclrtCreateStream(&mut probe).unwrap();
            probes.push(code);
            if code == 0 {
                assert_eq!(cann.aclrtDestroyStream(probe), Ok(0));
                break;
            }
        }
        assert_eq!(probes, [507899, 507899, 0]);
        assert_eq!(cann.rtMalloc(&mut p, 64, RT_MEMORY_HBM, 0), Ok(0), "healthy again");
    }
    let log = install.take_log().unwrap();
    let resets = log.iter().filter(|c| c.func == "aclrtResetDeviceForce").count();
    assert_eq!(resets, 3);
}

#[test]
fn device_sets_are_counted_and_a_released_device_refuses_any_reset() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    // SAFETY: plain integer arguments.
    unsafe {
        assert_eq!(cann.rtDeviceReset(0), Ok(107000), "nothing set yet");
        assert_eq!(cann.aclrtResetDeviceForce(0), Ok(107000), "nothing set yet");
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.aclrtSetDevice(0), Ok(0));
        assert_eq!(cann.rtDeviceReset(0), Ok(0), "one set left");
        assert_eq!(cann.aclrtResetDeviceForce(0), Ok(0), "releases the rest");
        assert_eq!(cann.aclrtResetDevice(0), Ok(107000), "released already");
        assert_eq!(cann.aclrtResetDeviceForce(0), Ok(107000), "released already");
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.rtDeviceReset(0), Ok(0));
        assert_eq!(cann.rtDeviceReset(0), Ok(107000), "a reset takes one set off");
    }
}

#[test]
fn a_force_reset_releases_its_devices_streams_events_and_aicpu_binaries() {
    let install = FakeInstall::standard().unwrap();
    install.set_value("device_count", 2).unwrap();
    let cann = install.cann();
    let json = op_json(&install, &["simpler_aicpu_exec_1"]);
    let mut option = rtLoadBinaryOption_t {
        optionId: RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE,
        value: rtLoadBinaryOptionValue_t { cpuKernelMode: 0 },
    };
    let config = rtLoadBinaryConfig_t { options: &mut option, numOpt: 1 };
    let kinds = [ObjectKind::Streams, ObjectKind::Events, ObjectKind::CpuBinaries];
    let live = || kinds.map(|k| install.live(k).unwrap());
    // SAFETY: valid out-pointers and live handles; plain integer arguments.
    unsafe {
        let mut handles = Vec::new();
        for device in [1, 0] {
            let mut stream: aclrtStream = ptr::null_mut();
            let mut event: aclrtEvent = ptr::null_mut();
            let mut binary: rtBinHandle = ptr::null_mut();
            assert_eq!(cann.aclrtSetDevice(device), Ok(0));
            assert_eq!(cann.aclrtCreateStream(&mut stream), Ok(0));
            assert_eq!(cann.aclrtCreateEvent(&mut event), Ok(0));
            assert_eq!(cann.rtsBinaryLoadFromFile(json.as_ptr(), &config, &mut binary), Ok(0));
            handles.push((stream, event, binary));
        }
        assert_eq!(live(), [2, 2, 2]);
        assert_eq!(cann.aclrtResetDeviceForce(0), Ok(0));
        assert_eq!(live(), [1, 1, 1], "device 1's handles stay");
        let (stream, event, binary) = handles[1];
        assert_eq!(cann.aclrtSetDevice(0), Ok(0));
        assert_eq!(cann.rtStreamDestroy(stream), Ok(107000), "released with the device");
        assert_eq!(cann.aclrtDestroyEvent(event), Ok(107000), "released with the device");
        assert_eq!(cann.rtsBinaryUnload(binary), Ok(107000), "released with the device");
    }
}

#[test]
fn aclinit_twice_reports_repeat_initialize_until_finalize() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    // SAFETY: null config path is allowed.
    unsafe {
        assert_eq!(cann.aclInit(ptr::null()), Ok(0));
        assert_eq!(cann.aclInit(ptr::null()), Ok(ACL_ERROR_REPEAT_INITIALIZE));
        assert_eq!(cann.aclFinalize(), Ok(0));
        assert_eq!(cann.aclInit(ptr::null()), Ok(0));
    }
}

#[test]
fn aclfinalize_without_an_initialisation_in_force_reports_repeat_finalize() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    // SAFETY: no arguments; null config path is allowed.
    unsafe {
        assert_eq!(cann.aclFinalize(), Ok(100_037), "never initialised");
        assert_eq!(cann.aclInit(ptr::null()), Ok(0));
        assert_eq!(cann.aclFinalize(), Ok(0));
        assert_eq!(cann.aclFinalize(), Ok(100_037), "finalized already");
    }
    assert_eq!(simpler_acl_sys::error_name(100_037).0, "ACL_ERROR_REPEAT_FINALIZE");
}

#[test]
fn events_record_and_synchronize() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let mut stream: aclrtStream = ptr::null_mut();
    let mut event: aclrtEvent = ptr::null_mut();
    let mut status: aclrtEventRecordedStatus = 99;
    // SAFETY: valid out-pointers and live handles.
    unsafe {
        assert_eq!(cann.aclrtCreateEvent(&mut event), Ok(107002), "nothing bound");
        assert_eq!(cann.aclrtSetDevice(0), Ok(0));
        assert_eq!(cann.aclrtCreateStream(&mut stream), Ok(0));
        assert_eq!(cann.aclrtCreateEvent(&mut event), Ok(0));
        assert_eq!(cann.aclrtQueryEventStatus(event, &mut status), Ok(0));
        assert_eq!(status, ACL_EVENT_RECORDED_STATUS_NOT_READY);
        assert_eq!(cann.aclrtRecordEvent(event, stream), Ok(0));
        assert_eq!(cann.aclrtQueryEventStatus(event, &mut status), Ok(0));
        assert_eq!(status, ACL_EVENT_RECORDED_STATUS_COMPLETE);
        assert_eq!(cann.aclrtStreamWaitEvent(stream, event), Ok(0));
        assert_eq!(cann.aclrtSynchronizeEventWithTimeout(event, 100), Ok(0));
        assert_eq!(cann.aclrtDestroyEvent(event), Ok(0));
        assert_eq!(cann.aclrtDestroyEvent(event), Ok(107000));
    }
}

#[test]
fn driver_calls_map_memory_and_report_device_facts() {
    let install = FakeInstall::standard().unwrap();
    install.set_value("device_count", 2).unwrap();
    let cann = install.cann();
    let mut dev: *mut c_void = ptr::null_mut();
    // SAFETY: valid pointers of the sizes passed.
    unsafe {
        assert_eq!(cann.rtMalloc(&mut dev, 4096, RT_MEMORY_HBM, 0), Ok(107002), "nothing bound");
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.rtMalloc(&mut dev, 4096, RT_MEMORY_HBM, 0), Ok(0));
        let mut host: *mut c_void = ptr::null_mut();
        assert_eq!(cann.halHostRegister(dev, 4096, DEV_SVM_MAP_HOST, 0, &mut host), Ok(0));
        assert_eq!(install.live(ObjectKind::Mappings).unwrap(), 1);
        assert_eq!(cann.halHostUnregister(dev, 0), Ok(0));
        assert_eq!(install.live(ObjectKind::Mappings).unwrap(), 0);
        let mut mask = 0i64;
        assert_eq!(
            cann.halGetDeviceInfo(0, MODULE_TYPE_AICPU as i32, INFO_TYPE_OCCUPY as i32, &mut mask),
            Ok(0)
        );
        assert_eq!(mask.count_ones(), 6);
        let mut input = AddrMapInPara { addr_type: ADDR_MAP_TYPE_REG_AIC_CTRL, devid: 0 };
        let mut output = AddrMapOutPara::default();
        let mut out_size = 0usize;
        let code = cann.halMemCtl(
            CTRL_TYPE_ADDR_MAP as i32,
            (&raw mut input).cast(),
            size_of::<AddrMapInPara>(),
            (&raw mut output).cast(),
            &mut out_size,
        );
        assert_eq!(code, Ok(0));
        assert_ne!(output.ptr, 0);
        // A free happens in the calling thread's context, which must be the allocation's.
        assert_eq!(cann.rtSetDevice(1), Ok(0));
        assert_eq!(cann.rtFree(dev), Ok(107000), "freed in device 1's context");
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.rtMalloc(&mut dev, 64, RT_MEMORY_HBM, 0), Ok(0));
    }
    let addr = dev as usize;
    std::thread::scope(|s| {
        // SAFETY: `addr` is a live allocation; the stand-in refuses the free on this thread.
        let unbound = s.spawn(|| unsafe { cann.rtFree(addr as *mut c_void) });
        assert_eq!(unbound.join().unwrap(), Ok(107002), "nothing bound on that thread");
    });
    // SAFETY: as above, on the thread bound to the allocation's device.
    assert_eq!(unsafe { cann.rtFree(dev) }, Ok(0));
}

#[test]
fn a_loader_outliving_its_install_keeps_working_on_the_copies_it_opened() {
    let cann = {
        let install = FakeInstall::standard().unwrap();
        let cann = install.cann();
        // SAFETY: a valid device id.
        assert_eq!(unsafe { cann.rtSetDevice(0) }, Ok(0));
        cann
    };
    // The install's first copy (whose state the runtime copy used) is unloaded now.
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: valid device id and out-pointer; `p` is freed by the call after.
    unsafe {
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_eq!(cann.rtMalloc(&mut p, 64, RT_MEMORY_HBM, 0), Ok(0));
        assert_eq!(cann.rtFree(p), Ok(0));
    }
    // Libraries not opened before are gone with the install's directory.
    // SAFETY: a valid device id.
    let err = unsafe { cann.aclrtSetDevice(0) }.unwrap_err();
    assert!(matches!(err, LoadError::Library { library: Library::Acl, .. }), "{err}");
}

#[test]
fn installs_in_parallel_threads_keep_separate_state() {
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let install = FakeInstall::standard().unwrap();
                let cann = install.cann();
                install.fail_call("rtSetDevice", 1, 1000 + i).unwrap();
                // SAFETY: a valid device id.
                let code = unsafe { cann.rtSetDevice(0) }.unwrap();
                let log: Vec<Call> = install.take_log().unwrap();
                (code, log.len())
            })
        })
        .collect();
    for (i, thread) in threads.into_iter().enumerate() {
        assert_eq!(thread.join().unwrap(), (1000 + i as i32, 1));
    }
}

#[cfg(feature = "hccl")]
#[test]
fn hccl_functions_resolve_from_the_communication_library() {
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    let mut root = HcclRootInfo { internal: [0; 4108] };
    let mut comm: HcclComm = ptr::null_mut();
    let mut stream: aclrtStream = ptr::null_mut();
    // SAFETY: valid out-pointers and live handles.
    unsafe {
        assert_eq!(cann.HcclGetRootInfo(&mut root), Ok(0));
        assert_eq!(cann.HcclCommInitRootInfo(2, &root, 0, &mut comm), Ok(0));
        assert_eq!(cann.HcclCommInitRootInfo(2, &root, 2, &mut comm.clone()), Ok(107000));
        assert_eq!(cann.aclrtSetDevice(0), Ok(0));
        assert_eq!(cann.aclrtCreateStream(&mut stream), Ok(0));
        assert_eq!(cann.HcclBarrier(comm, stream), Ok(0));
        assert_eq!(cann.HcclCommDestroy(comm), Ok(0));
    }
    assert!(
        matches!(cann.library_source(Library::Hccl), Some(Candidate::Path(p)) if p.ends_with("libhcomm.so"))
    );
}

/// Allocates `size` bytes of device 0's memory and maps them for the host.
///
/// # Safety
///
/// The thread is bound to device 0 of `cann`'s install.
unsafe fn mapped_block(cann: &Cann, size: u64) -> (*mut c_void, *mut u8) {
    let (mut dev, mut host): (*mut c_void, *mut c_void) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid out-pointers; the mapping covers exactly the allocation.
    unsafe {
        assert_eq!(cann.rtMalloc(&mut dev, size, RT_MEMORY_HBM, 0), Ok(0));
        assert_eq!(cann.halHostRegister(dev, size as usize, 0, 0, &mut host), Ok(0));
    }
    (dev, host.cast())
}

/// Allocates `n` blocks of `size` bytes, none of which may be `taken`; frees them again.
///
/// # Safety
///
/// The thread is bound to device 0 of `cann`'s install.
unsafe fn assert_never_handed_out(cann: &Cann, size: u64, taken: *mut c_void) {
    let mut others = Vec::new();
    for _ in 0..32 {
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { cann.rtMalloc(&mut p, size, RT_MEMORY_HBM, 0) }, Ok(0));
        assert_ne!(p, taken, "storage a live mapping covers was handed out again");
        others.push(p);
    }
    for p in others {
        // SAFETY: an allocation of this thread's device.
        assert_eq!(unsafe { cann.rtFree(p) }, Ok(0));
    }
}

#[test]
fn a_reset_keeps_the_storage_a_live_mapping_covers_until_the_mapping_is_unregistered() {
    const SIZE: u64 = 4096;
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    // SAFETY: a valid device id; `host` maps `SIZE` bytes.
    let (dev, host) = unsafe {
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        let (dev, host) = mapped_block(&cann, SIZE);
        host.write_bytes(0x5A, SIZE as usize);
        (dev, host)
    };
    install.reset().unwrap();
    assert_eq!(install.live(ObjectKind::Allocations).unwrap(), 0);
    assert_eq!(install.live(ObjectKind::Mappings).unwrap(), 1, "the mapping stays registered");
    assert_eq!(install.live(ObjectKind::Retired).unwrap(), 1);
    // SAFETY: the thread is still bound to device 0; the mapping is live, so `host` still
    // covers `SIZE` bytes of kept storage.
    unsafe {
        assert_eq!(cann.rtSetDevice(0), Ok(0));
        assert_never_handed_out(&cann, SIZE, dev);
        let seen = std::slice::from_raw_parts(host, SIZE as usize);
        assert!(seen.iter().all(|&b| b == 0x5A), "the mapped storage changed");
        assert_eq!(cann.halHostUnregister(dev, 0), Ok(0));
        assert_eq!(cann.rtFree(dev), Ok(107000), "the reset gave the allocation back");
    }
    assert_eq!(install.live(ObjectKind::Retired).unwrap(), 0, "unregistering freed it");
    assert_eq!(install.live(ObjectKind::Mappings).unwrap(), 0);
}

#[test]
fn memory_freed_or_released_by_a_force_reset_under_a_live_mapping_is_kept_until_it_goes() {
    const SIZE: u64 = 8192;
    let install = FakeInstall::standard().unwrap();
    let cann = install.cann();
    // SAFETY: a valid device id; every pointer used is a live allocation or mapping of it.
    unsafe {
        assert_eq!(cann.aclrtSetDevice(0), Ok(0));
        let (freed, _) = mapped_block(&cann, SIZE);
        let (released, _) = mapped_block(&cann, SIZE);
        assert_eq!(cann.rtFree(freed), Ok(0));
        assert_eq!(install.live(ObjectKind::Allocations).unwrap(), 1);
        assert_eq!(install.live(ObjectKind::Retired).unwrap(), 1);
        assert_eq!(cann.aclrtResetDeviceForce(0), Ok(0));
        assert_eq!(install.live(ObjectKind::Allocations).unwrap(), 0);
        assert_eq!(install.live(ObjectKind::Retired).unwrap(), 2);
        assert_eq!(cann.aclrtSetDevice(0), Ok(0));
        assert_never_handed_out(&cann, SIZE, freed);
        assert_never_handed_out(&cann, SIZE, released);
        assert_eq!(cann.halHostUnregister(freed, 0), Ok(0));
        assert_eq!(install.live(ObjectKind::Retired).unwrap(), 1);
        assert_eq!(cann.halHostUnregister(released, 0), Ok(0));
        assert_eq!(install.live(ObjectKind::Retired).unwrap(), 0);
    }
}

#[test]
fn a_copy_placed_while_another_thread_loads_from_the_install_is_linked_before_it_is_called() {
    const ROUNDS: usize = 200;
    let mut install = FakeInstall::standard().unwrap();
    for round in 0..ROUNDS {
        let dir = format!("opt/round-{round}");
        let config = install.config_with_env(&[("SIMPLER_ASCEND_LIB_DIR", &format!("@/{dir}"))]);
        let wanted = install.root().join(&dir).join(Library::Acl.name());
        let caller = std::thread::spawn(move || {
            let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
            loop {
                // SAFETY: the search reaches only the install's root, which holds only stand-in
                // copies.
                let cann = unsafe { Cann::new(config.clone()) };
                // Until this round's copy appears the default root's is found: call the round's
                // copy as soon as it can be opened.
                if matches!(cann.open(Library::Acl), Ok(Candidate::Path(p)) if *p == wanted) {
                    cann.version().expect("the copy answers the version");
                    return;
                }
                assert!(std::time::Instant::now() < give_up, "the round's copy never opened");
                std::thread::yield_now();
            }
        });
        install.place(Library::Acl, &dir).unwrap();
        caller.join().unwrap();
        assert_eq!(
            install.take_calls().unwrap(),
            ["aclrtGetVersion"],
            "round {round}: a call reached a copy before it shared the install's state"
        );
    }
}
