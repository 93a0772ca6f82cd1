//! The bootstrap dispatcher, compiled for the host and driven through its C entries in a
//! temporary install directory: argument parsing, the installed file's name and content,
//! skipping an identical file, replacing a different one, and leaving no temporary file behind.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;

use simpler_onboard_programs::{
    DISPATCHER_ENTRIES, DISPATCHER_SOURCE, DeviceArgs, DispatchCode, INSTALL_DIR_DEFINE,
    MAX_PROGRAM_BYTES, build_id, fingerprint, installed_name, kernel_args_bytes,
};

type Entry = unsafe extern "C" fn(*mut c_void) -> i32;

fn compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Compiles `source` into a shared object at `out` with the extra `flags`.
fn compile_shared(source: &Path, out: &Path, flags: &[String]) {
    let status = Command::new(compiler())
        .args(["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"])
        .args(flags)
        .arg(source)
        .arg("-o")
        .arg(out)
        .status()
        .expect("a C compiler (cc or $CC) is needed to build the dispatcher for the host");
    assert!(status.success(), "compiling {} failed", source.display());
}

/// The dispatcher built for the host, installing into `<dir>/install`.
struct Dispatcher {
    _lib: libloading::Library,
    init: Entry,
    others: [Entry; 2],
    install: PathBuf,
}

impl Dispatcher {
    fn build(dir: &Path) -> Dispatcher {
        let install = dir.join("install");
        std::fs::create_dir_all(&install).unwrap();
        let src = dir.join("dispatcher.c");
        std::fs::write(&src, DISPATCHER_SOURCE).unwrap();
        let lib = dir.join("libsimpler_aicpu_dispatcher.so");
        let define = format!("-D{INSTALL_DIR_DEFINE}=\"{}\"", install.display());
        compile_shared(&src, &lib, &[define, "-D_POSIX_C_SOURCE=200809L".into()]);
        // SAFETY: the library is the dispatcher just built; its initializers do nothing.
        let lib = unsafe { libloading::Library::new(&lib) }.unwrap();
        let get = |name: &str| -> Entry {
            // SAFETY: each entry has the C signature `int (void *)`.
            *unsafe { lib.get::<Entry>(name.as_bytes()) }.unwrap()
        };
        let init = get(DISPATCHER_ENTRIES[1]);
        let others = [get(DISPATCHER_ENTRIES[0]), get(DISPATCHER_ENTRIES[2])];
        Dispatcher { _lib: lib, init, others, install }
    }

    /// Calls the init entry with a kernel argument block pointing at `args`, which points at
    /// `program` (host memory stands in for device memory).
    fn install_program(&self, program: &[u8], device: u64) -> DispatchCode {
        let args = DeviceArgs {
            dispatcher: (0, 0),
            device_id: device,
            program: (program.as_ptr() as u64, program.len() as u64),
        };
        self.call(&args)
    }

    fn call(&self, args: &DeviceArgs) -> DispatchCode {
        let device_args = args.to_bytes();
        let mut kernel_args = kernel_args_bytes(device_args.as_ptr() as u64);
        // SAFETY: both blocks outlive the call and every address in them is readable memory
        // of the stated length (or zero, which the dispatcher refuses before reading).
        DispatchCode::from_raw(unsafe { (self.init)(kernel_args.as_mut_ptr().cast()) })
    }

    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.install)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// A minimal ELF64 image with one PT_NOTE segment holding a GNU build-id, followed by `tail`.
fn elf_with_build_id(id: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; 64 + 56];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
    b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
    b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
    let note_off = b.len() as u64;
    let mut note = Vec::new();
    note.extend_from_slice(&4u32.to_le_bytes());
    note.extend_from_slice(&(id.len() as u32).to_le_bytes());
    note.extend_from_slice(&3u32.to_le_bytes());
    note.extend_from_slice(b"GNU\0");
    note.extend_from_slice(id);
    note.resize(note.len().div_ceil(4) * 4, 0);
    let ph = 64;
    b[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
    b[ph + 8..ph + 16].copy_from_slice(&note_off.to_le_bytes());
    b[ph + 0x20..ph + 0x28].copy_from_slice(&(note.len() as u64).to_le_bytes());
    b.extend_from_slice(&note);
    b.extend_from_slice(tail);
    b
}

#[test]
fn installs_the_program_under_its_fingerprint_and_device_with_the_exact_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::build(dir.path());
    let program = elf_with_build_id(&[0xAB; 20], b"program body");
    assert_eq!(d.install_program(&program, 1), DispatchCode::Ok);
    let name = installed_name(fingerprint(&program), 1);
    assert_eq!(d.files(), std::slice::from_ref(&name));
    assert_eq!(std::fs::read(d.install.join(&name)).unwrap(), program);
    // The second die of the same chip gets its own file.
    assert_eq!(d.install_program(&program, 2), DispatchCode::Ok);
    assert_eq!(d.files().len(), 2);
}

#[test]
fn an_identical_file_is_left_alone_and_a_different_one_is_replaced() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::build(dir.path());
    let program = elf_with_build_id(&[7; 20], b"first");
    assert_eq!(d.install_program(&program, 0), DispatchCode::Ok);
    let path = d.install.join(installed_name(fingerprint(&program), 0));
    let inode = std::fs::metadata(&path).unwrap().ino();
    assert_eq!(d.install_program(&program, 0), DispatchCode::Ok);
    assert_eq!(
        std::fs::metadata(&path).unwrap().ino(),
        inode,
        "an identical file is not rewritten"
    );
    // Same build id, different bytes (a rebuilt program that kept its id): replaced by rename.
    let changed = elf_with_build_id(&[7; 20], b"second");
    assert_eq!(fingerprint(&changed), fingerprint(&program));
    assert_eq!(d.install_program(&changed, 0), DispatchCode::Ok);
    assert_ne!(std::fs::metadata(&path).unwrap().ino(), inode, "a different file is replaced");
    assert_eq!(std::fs::read(&path).unwrap(), changed);
    assert_eq!(d.files().len(), 1, "no temporary file is left behind");
}

#[test]
fn malformed_arguments_get_their_own_codes_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::build(dir.path());
    // SAFETY: a null argument is refused before any read.
    let code = unsafe { (d.init)(std::ptr::null_mut()) };
    assert_eq!(DispatchCode::from_raw(code), DispatchCode::NullArgs);
    let mut no_device_args = kernel_args_bytes(0);
    // SAFETY: the block is 48 readable bytes whose DeviceArgs address is zero.
    let code = unsafe { (d.init)(no_device_args.as_mut_ptr().cast()) };
    assert_eq!(DispatchCode::from_raw(code), DispatchCode::NullDeviceArgs);
    let program = elf_with_build_id(&[1; 8], b"");
    let addr = program.as_ptr() as u64;
    let cases = [
        ((0, 100), DispatchCode::NoProgram),
        ((addr, 0), DispatchCode::NoProgram),
        ((addr, MAX_PROGRAM_BYTES + 1), DispatchCode::ProgramTooLarge),
    ];
    for (program, want) in cases {
        let args = DeviceArgs { dispatcher: (0, 0), device_id: 0, program };
        assert_eq!(d.call(&args), want, "{program:?}");
    }
    assert_eq!(d.install_program(b"MZ not an elf", 0), DispatchCode::NotAnElf);
    assert!(d.files().is_empty());
    for other in d.others {
        // SAFETY: the stubs only compare their argument with null.
        assert_eq!(unsafe { other(std::ptr::null_mut()) }, -1);
        // SAFETY: as above; a non-null argument is never read.
        assert_eq!(unsafe { other(no_device_args.as_mut_ptr().cast()) }, 0);
    }
}

#[test]
fn a_missing_install_directory_fails_to_create_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::build(dir.path());
    std::fs::remove_dir(&d.install).unwrap();
    let program = elf_with_build_id(&[2; 20], b"x");
    assert_eq!(d.install_program(&program, 0), DispatchCode::CreateFailed);
    assert!(!d.install.exists());
}

#[test]
fn concurrent_installs_of_one_program_leave_one_complete_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::build(dir.path());
    let program = elf_with_build_id(&[3; 20], &vec![0x5A; 1 << 20]);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..8 {
                    assert_eq!(d.install_program(&program, 0), DispatchCode::Ok);
                }
            });
        }
    });
    let name = installed_name(fingerprint(&program), 0);
    assert_eq!(d.files(), std::slice::from_ref(&name));
    assert_eq!(std::fs::read(d.install.join(name)).unwrap(), program);
}

#[test]
fn a_real_shared_object_is_named_by_its_linker_build_id_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let d = Dispatcher::build(dir.path());
    let src = dir.path().join("program.c");
    std::fs::write(&src, "int simpler_aicpu_exec(void *args) { return args == 0; }\n").unwrap();
    let so = dir.path().join("program.so");
    compile_shared(&src, &so, &["-Wl,--build-id=sha1".into()]);
    let program = std::fs::read(&so).unwrap();
    assert_eq!(build_id(&program).map(<[u8]>::len), Some(20), "sha1 build ids are 20 bytes");
    assert_eq!(d.install_program(&program, 0), DispatchCode::Ok);
    assert_eq!(d.files(), [installed_name(fingerprint(&program), 0)]);
}

/// An ELF64 image with two PT_NOTE headers: the first names a segment whose end overflows, the
/// second a GNU build-id.
fn elf_with_an_overflowing_note_first(id: &[u8]) -> Vec<u8> {
    let one = elf_with_build_id(id, b"");
    let note = &one[64 + 56..];
    let mut b = vec![0u8; 64 + 2 * 56];
    b[..64].copy_from_slice(&one[..64]);
    b[0x38..0x3a].copy_from_slice(&2u16.to_le_bytes());
    let (first, second) = (64, 64 + 56);
    b[first..first + 4].copy_from_slice(&4u32.to_le_bytes());
    b[first + 8..first + 16].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    b[first + 0x20..first + 0x28].copy_from_slice(&16u64.to_le_bytes());
    b[second..second + 4].copy_from_slice(&4u32.to_le_bytes());
    let note_off = b.len() as u64;
    b[second + 8..second + 16].copy_from_slice(&note_off.to_le_bytes());
    b[second + 0x20..second + 0x28].copy_from_slice(&(note.len() as u64).to_le_bytes());
    b.extend_from_slice(note);
    b
}

#[test]
fn malformed_header_tables_get_the_same_fingerprint_on_both_sides() {
    // A header table running past the end: no build-id on either side, even though its first
    // header holds one.
    let mut past_the_end = elf_with_build_id(&[4; 20], b"");
    past_the_end[0x38..0x3a].copy_from_slice(&1000u16.to_le_bytes());
    let overflowing_first = elf_with_an_overflowing_note_first(&[5; 20]);
    assert_eq!(build_id(&past_the_end), None);
    assert_eq!(build_id(&overflowing_first), Some(&[5u8; 20][..]), "the bad segment is skipped");
    for program in [past_the_end, overflowing_first] {
        let dir = tempfile::tempdir().unwrap();
        let d = Dispatcher::build(dir.path());
        assert_eq!(d.install_program(&program, 0), DispatchCode::Ok);
        assert_eq!(d.files(), [installed_name(fingerprint(&program), 0)]);
    }
}
