//! `simpler-onboard-programs` — the sources of the programs simpler installs on a real A2/A3
//! chip, and the host-side facts about them that the onboard backend needs.
//!
//! Layer: beside `simpler-device-a2a3`, depending on nothing; the onboard backend and `xtask`
//! use it. It must not load CANN or touch a device.
//!
//! It holds the AICore executor's C++ sources ([`EXECUTOR_SOURCES`], compiled once per
//! [`AICORE_ROLES`] entry; with feature `host-build`, [`build_host_executor`] compiles them for
//! the host so the simulator runs the very entries CANN launches)
//! and the bootstrap dispatcher: the small C shared object CANN's AICPU framework
//! loads, which installs simpler's AICPU program as a file (protocol in
//! `docs/onboard-programs.md`). This crate gives its source ([`DISPATCHER_SOURCE`]), the
//! argument block the host fills ([`DeviceArgs`]), the name the program is installed under
//! ([`installed_name`], from [`fingerprint`]) and the dispatcher's return codes
//! ([`DispatchCode`]). The tests compile the dispatcher for the host and drive it in a
//! temporary directory, so the C that ships is the C that is tested.
//!
//! ```
//! use simpler_onboard_programs::{fingerprint, installed_name};
//!
//! // A program's name on the device follows from its bytes (its GNU build id when it has one).
//! let program = b"not an ELF: the whole bytes are hashed";
//! let fp = fingerprint(program);
//! assert_eq!(fp, fingerprint(program));
//! assert_eq!(installed_name(fp, 1), format!("simpler_inner_{fp:016x}_1.so"));
//! ```
//!
//! Unsafe code: none in the library (`forbid(unsafe_code)`); the tests call the compiled
//! dispatcher through its C entries.

#![forbid(unsafe_code)]

use std::fmt;

#[cfg(feature = "host-build")]
mod build_error;

#[cfg(feature = "host-build")]
pub use build_error::BuildError;

/// The dispatcher's C source (C99 + POSIX), built with the AICPU cross compiler for the device
/// and with the host compiler for the tests.
pub const DISPATCHER_SOURCE: &str = include_str!("../dispatcher/dispatcher.c");

/// The preprocessor setting that chooses where the dispatcher installs the program. The
/// device default is [`DEVICE_INSTALL_DIR`]; host tests point it at a temporary directory.
pub const INSTALL_DIR_DEFINE: &str = "SIMPLER_DISPATCHER_INSTALL_DIR";

/// Where the dispatcher installs the program on the device's AICPU filesystem.
pub const DEVICE_INSTALL_DIR: &str = "/usr/lib64/aicpu_kernels/0/aicpu_kernels_device";

/// The entries the AICPU framework resolves, in the order it looks them up. Only the second
/// does work; the other two accept any non-null argument and return 0.
pub const DISPATCHER_ENTRIES: [&str; 3] = [
    "StaticTileFwkBackendKernelServer",
    "DynTileFwkBackendKernelServerInit",
    "DynTileFwkBackendKernelServer",
];

/// Byte offset, inside the kernel argument block the framework passes to the init entry, of
/// the device address of the [`DeviceArgs`] block.
pub const KERNEL_ARGS_DEVICE_ARGS_OFFSET: usize = 40;

/// Size of the kernel argument block that carries the [`DeviceArgs`] address.
pub const KERNEL_ARGS_LEN: usize = 48;

/// Largest program the dispatcher installs; a larger length is refused as corrupt.
pub const MAX_PROGRAM_BYTES: u64 = 256 << 20;

/// The 160-byte argument block the host writes to device memory before launching the init
/// entry: the dispatcher's own image and the program it installs.
///
/// The first 96 bytes belong to the framework and stay zero; the rest are little-endian
/// qwords.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DeviceArgs {
    /// Device address and length of the dispatcher image.
    pub dispatcher: (u64, u64),
    /// The device id the program is installed for (one file per die).
    pub device_id: u64,
    /// Device address and length of the AICPU program image.
    pub program: (u64, u64),
}

impl DeviceArgs {
    /// Size of the block.
    pub const LEN: usize = 160;
    const DISPATCHER_ADDR: usize = 96;
    const DISPATCHER_LEN: usize = 104;
    const DEVICE_ID: usize = 112;
    const PROGRAM_ADDR: usize = 120;
    const PROGRAM_LEN: usize = 128;

    /// The block as the dispatcher reads it.
    pub fn to_bytes(&self) -> [u8; DeviceArgs::LEN] {
        let mut b = [0u8; DeviceArgs::LEN];
        for (off, v) in [
            (Self::DISPATCHER_ADDR, self.dispatcher.0),
            (Self::DISPATCHER_LEN, self.dispatcher.1),
            (Self::DEVICE_ID, self.device_id),
            (Self::PROGRAM_ADDR, self.program.0),
            (Self::PROGRAM_LEN, self.program.1),
        ] {
            b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// The kernel argument block for the init entry: zero but for the [`DeviceArgs`] address.
pub fn kernel_args_bytes(device_args_addr: u64) -> [u8; KERNEL_ARGS_LEN] {
    let mut b = [0u8; KERNEL_ARGS_LEN];
    b[KERNEL_ARGS_DEVICE_ARGS_OFFSET..].copy_from_slice(&device_args_addr.to_le_bytes());
    b
}

/// What the dispatcher's init entry returned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum DispatchCode {
    /// Installed, or an identical file was already there.
    Ok,
    /// The kernel argument pointer was null.
    NullArgs,
    /// The kernel argument block held no [`DeviceArgs`] address.
    NullDeviceArgs,
    /// The program address or length was zero.
    NoProgram,
    /// The program length exceeded [`MAX_PROGRAM_BYTES`].
    ProgramTooLarge,
    /// The program does not start with the ELF magic.
    NotAnElf,
    /// The install path did not fit the dispatcher's buffer.
    PathTooLong,
    /// The temporary file could not be created in the install directory.
    CreateFailed,
    /// Writing or flushing the temporary file failed.
    WriteFailed,
    /// Renaming the temporary file over the target failed.
    RenameFailed,
    /// A value this version does not know.
    Unknown(i32),
}

impl DispatchCode {
    /// Decodes the entry's return value.
    pub fn from_raw(code: i32) -> DispatchCode {
        match code {
            0 => DispatchCode::Ok,
            -1 => DispatchCode::NullArgs,
            -2 => DispatchCode::NullDeviceArgs,
            -3 => DispatchCode::NoProgram,
            -4 => DispatchCode::ProgramTooLarge,
            -5 => DispatchCode::NotAnElf,
            -6 => DispatchCode::PathTooLong,
            -7 => DispatchCode::CreateFailed,
            -8 => DispatchCode::WriteFailed,
            -9 => DispatchCode::RenameFailed,
            other => DispatchCode::Unknown(other),
        }
    }
}

impl fmt::Display for DispatchCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            DispatchCode::Ok => "installed",
            DispatchCode::NullArgs => "the kernel argument pointer was null",
            DispatchCode::NullDeviceArgs => "the kernel arguments held no DeviceArgs address",
            DispatchCode::NoProgram => "the DeviceArgs program address or length was zero",
            DispatchCode::ProgramTooLarge => "the program length exceeds the 256 MiB limit",
            DispatchCode::NotAnElf => "the program is not an ELF object",
            DispatchCode::PathTooLong => "the install path is too long",
            DispatchCode::CreateFailed => "the temporary file could not be created",
            DispatchCode::WriteFailed => "writing the temporary file failed",
            DispatchCode::RenameFailed => "renaming the temporary file into place failed",
            DispatchCode::Unknown(c) => return write!(f, "unknown dispatcher code {c}"),
        };
        f.write_str(text)
    }
}

/// FNV-1a, 64 bits.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// The `N` bytes at `off`; `None` past the end, also for an offset near `usize::MAX` (an
/// object's own offsets are untrusted).
fn bytes_at<const N: usize>(b: &[u8], off: usize) -> Option<[u8; N]> {
    b.get(off..off.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from(u16::from_le_bytes(bytes_at(b, off)?)))
}

fn u32_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from(u32::from_le_bytes(bytes_at(b, off)?)))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes_at(b, off)?))
}

/// The GNU build-id of a little-endian ELF64 object, found through its program headers.
pub fn build_id(elf: &[u8]) -> Option<&[u8]> {
    if elf.len() < 64 || elf[4] != 2 || elf[5] != 1 {
        return None;
    }
    let phoff = usize::try_from(u64_at(elf, 0x20)?).ok()?;
    let phentsize = usize::try_from(u16_at(elf, 0x36)?).ok()?;
    let phnum = usize::try_from(u16_at(elf, 0x38)?).ok()?;
    // The whole header table must lie inside the object, as the dispatcher requires: a table
    // running past the end is no build-id, even if an early header holds one.
    let table_fits =
        elf.len().checked_sub(phoff).is_some_and(|rest| phnum <= rest / phentsize.max(1));
    if phentsize < 56 || !table_fits {
        return None;
    }
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(elf, ph)? != 4 {
            continue;
        }
        let off = usize::try_from(u64_at(elf, ph + 0x08)?).ok()?;
        let size = usize::try_from(u64_at(elf, ph + 0x20)?).ok()?;
        // A segment outside the object is skipped, as the dispatcher skips it.
        let Some(notes) = off.checked_add(size).and_then(|end| elf.get(off..end)) else { continue };
        let mut pos = 0usize;
        while notes.len() - pos >= 12 {
            let namesz = usize::try_from(u32_at(notes, pos)?).ok()?;
            let descsz = usize::try_from(u32_at(notes, pos + 4)?).ok()?;
            let kind = u32_at(notes, pos + 8)?;
            let name_end = 12 + namesz.checked_add(3)? / 4 * 4;
            let desc_len = descsz.checked_add(3)? / 4 * 4;
            if name_end > notes.len() - pos || desc_len > notes.len() - pos - name_end {
                break;
            }
            if kind == 3 && namesz == 4 && &notes[pos + 12..pos + 16] == b"GNU\0" && descsz > 0 {
                return notes.get(pos + name_end..pos + name_end + descsz);
            }
            pos += name_end + desc_len;
        }
    }
    None
}

/// The program's fingerprint, as the dispatcher computes it: FNV-1a-64 of its GNU build-id, or
/// of the whole image when it has none.
pub fn fingerprint(program: &[u8]) -> u64 {
    fnv1a64(build_id(program).unwrap_or(program))
}

/// The file name the dispatcher installs a program under for one device (the device suffix
/// keeps the two dies of one chip apart); the host names it in the kernel descriptor it loads.
pub fn installed_name(fingerprint: u64, device_id: u64) -> String {
    format!("simpler_inner_{fingerprint:016x}_{device_id}.so")
}

/// The AICore executor's sources, as (file name, text): the kernel entry, the executor loop,
/// its platform header with the two mappings (CCE for the AICore, host for the simulator) and
/// the host build's per-thread core binding. They are written side by side into one directory
/// to compile.
pub const EXECUTOR_SOURCES: [(&str, &str); 6] = [
    ("entry.cpp", include_str!("../aicore/entry.cpp")),
    ("executor.h", include_str!("../aicore/executor.h")),
    ("aicore_platform.h", include_str!("../aicore/aicore_platform.h")),
    ("aicore_platform_host.h", include_str!("../aicore/aicore_platform_host.h")),
    ("aicore_platform_cce.h", include_str!("../aicore/aicore_platform_cce.h")),
    ("host_bind.cpp", include_str!("../aicore/host_bind.cpp")),
];

/// The source compiled once per core role into the AICore binary.
pub const EXECUTOR_ENTRY_SOURCE: &str = "entry.cpp";

/// The preprocessor setting that selects the role `entry.cpp` is compiled for (0 cube, 1
/// vector), and with it the entry it defines.
pub const ROLE_DEFINE: &str = "SIMPLER_AICORE_VEC";

/// One AICore role of a mixed launch: the role suffix of its object, the CCE architecture it
/// is compiled for, the value of [`ROLE_DEFINE`] and the kernel entry CANN launches on it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AicoreRole {
    /// `aic` or `aiv`.
    pub suffix: &'static str,
    /// The `--cce-aicore-arch` value.
    pub arch: &'static str,
    /// The value of [`ROLE_DEFINE`].
    pub vec: u32,
    /// The entry symbol the role's object defines.
    pub entry: &'static str,
}

/// The two roles of an A2/A3 mixed launch: cube cores (AIC) and vector cores (AIV). The
/// onboard backend launches the binary by these entries.
pub const AICORE_ROLES: [AicoreRole; 2] = [
    AicoreRole { suffix: "aic", arch: "dav-c220-cube", vec: 0, entry: "aicore_kernel_0_mix_aic" },
    AicoreRole { suffix: "aiv", arch: "dav-c220-vec", vec: 1, entry: "aicore_kernel_0_mix_aiv" },
];

/// The host build's entry that binds a simulated core to the calling thread before the
/// simulator calls a role's kernel entry.
pub const HOST_BIND_ENTRY: &str = "simpler_aicore_bind";

/// Compiles the AICore executor for the host into a shared object in `dir` (feature
/// `host-build`: the `cc` crate picks the host's C++ compiler) and returns its path. As on the
/// AICore, `entry.cpp` is compiled once per role (objects `entry_aic.o` and `entry_aiv.o`,
/// left in `dir`), and the objects are linked together with the host's core binding.
#[cfg(feature = "host-build")]
pub fn build_host_executor(dir: &std::path::Path) -> Result<std::path::PathBuf, BuildError> {
    let out = dir.join("libsimpler_aicore_executor.so");
    let flags =
        ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-fno-exceptions", "-fno-rtti"];
    write_sources(dir, &EXECUTOR_SOURCES)?;
    let mut objects = Vec::new();
    for role in AICORE_ROLES {
        let object = dir.join(format!("entry_{}.o", role.suffix));
        let define = format!("-D{ROLE_DEFINE}={}", role.vec);
        let mut args: Vec<std::ffi::OsString> = vec![define.into(), "-c".into(), "-o".into()];
        args.extend([object.clone().into(), dir.join(EXECUTOR_ENTRY_SOURCE).into()]);
        host_compile(true, &flags, &args)?;
        objects.push(object);
    }
    let bind = dir.join("host_bind.o");
    host_compile(
        true,
        &flags,
        &["-c".into(), "-o".into(), bind.clone().into(), dir.join("host_bind.cpp").into()],
    )?;
    objects.push(bind);
    let mut link: Vec<std::ffi::OsString> = vec!["-shared".into(), "-o".into(), out.clone().into()];
    link.extend(objects.into_iter().map(Into::into));
    host_compile(true, &flags, &link)?;
    Ok(out)
}

/// The kernel ABI header the test kernels include.
pub const KERNEL_ABI_HEADER: (&str, &str) =
    ("kernel_abi.h", include_str!("../kernels/kernel_abi.h"));

/// One test kernel of the onboard case set: its name, the vector example's func id it
/// implements, and its CCE C++ source (one `kernel_entry` per object, as CANN's kernels).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TestKernel {
    /// `add`, `add_scalar`, `mul`, `hang`.
    pub name: &'static str,
    /// The func id it is registered under in the vector example.
    pub func_id: u32,
    /// Its source file name.
    pub file: &'static str,
    /// Its source text.
    pub source: &'static str,
}

/// The vector example's kernels (`out = x + y`, `out = x + s`, `out = x * y` over f32) as CCE
/// sources: compiled by ccec for the AIV on a server, and for the host so the simulator runs
/// the same source.
pub const TEST_KERNELS: [TestKernel; 3] = [
    TestKernel {
        name: "add",
        func_id: 0,
        file: "add.cpp",
        source: include_str!("../kernels/add.cpp"),
    },
    TestKernel {
        name: "add_scalar",
        func_id: 1,
        file: "add_scalar.cpp",
        source: include_str!("../kernels/add_scalar.cpp"),
    },
    TestKernel {
        name: "mul",
        func_id: 2,
        file: "mul.cpp",
        source: include_str!("../kernels/mul.cpp"),
    },
];

/// The hanging kernel of the onboard case set, registered in place of `add_scalar` (func 1):
/// it never returns (a volatile re-read of its first argument slot, forever), so on a chip
/// the op-execute watchdog ends it and poisons the device. Built with the others; the
/// simulator never runs it (its hang is the fault plan's).
pub const HANG_KERNEL: TestKernel = TestKernel {
    name: "hang",
    func_id: 1,
    file: "hang.cpp",
    source: include_str!("../kernels/hang.cpp"),
};

/// Every kernel the builds compile: [`TEST_KERNELS`], then [`HANG_KERNEL`].
pub const BUILT_KERNELS: [TestKernel; 4] =
    [TEST_KERNELS[0], TEST_KERNELS[1], TEST_KERNELS[2], HANG_KERNEL];

/// The C orchestration ABI header (`orch_abi.h`): the ops table, descriptors and entry types a
/// tensormap_and_ringbuffer `DeviceObject` orchestration is written against.
pub const ORCH_ABI_HEADER: (&str, &str) =
    ("orch_abi.h", include_str!("../orchestrations/orch_abi.h"));

/// The orchestration object's sources: the vector example as a C orchestration and the error
/// fixtures linked beside it.
pub const ORCHESTRATION_SOURCES: [(&str, &str); 2] = [
    ("vector_orch.c", include_str!("../orchestrations/vector_orch.c")),
    ("fixtures_orch.c", include_str!("../orchestrations/fixtures_orch.c")),
];

/// Every file the orchestration object is compiled from: the ABI header, then
/// [`ORCHESTRATION_SOURCES`].
pub const ORCHESTRATION_FILES: [(&str, &str); 3] =
    [ORCH_ABI_HEADER, ORCHESTRATION_SOURCES[0], ORCHESTRATION_SOURCES[1]];

/// The vector example's C entry and config symbols in the orchestration object.
pub const VECTOR_ORCHESTRATION: (&str, &str) = ("vector_example", "vector_config");
/// The C entry and config symbols of `f = a + b` (one AIV task, func 0) in the object.
pub const ADD_ORCHESTRATION: (&str, &str) = ("vector_add", "vector_config");
/// A config symbol of the object that asks for four arguments.
pub const FOUR_ARGS_CONFIG: &str = "four_args_config";
/// An entry symbol of the object that returns status 7 without submitting.
pub const FAILING_ENTRY: &str = "failing_entry";
/// The C entry and config symbols of `f = a + b` (func 0) followed by a read of `f`, so that
/// the entry waits inside the object until the task completed.
pub const WAITING_ADD_ORCHESTRATION: (&str, &str) = ("waiting_add", "vector_config");

/// The C entry and config symbols of `f = a + b` submitted as an AIV task whose other two
/// kernel slots name func 0 instead of none, which the runtime refuses.
pub const AIV_WITH_EXTRA_KERNELS: (&str, &str) = ("aiv_with_extra_kernels", "vector_config");

/// The C flags of the orchestration object, for the host and the AICPU alike.
pub const ORCHESTRATION_CFLAGS: [&str; 5] = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror"];

/// The file name of the built orchestration object.
pub const ORCHESTRATION_OBJECT: &str = "liborchestrations.so";

/// Compiles [`ORCHESTRATION_SOURCES`] for the host into `liborchestrations.so` in `dir`
/// (feature `host-build`), the object the simulator registers as a `DeviceObject`.
#[cfg(feature = "host-build")]
pub fn build_host_orchestrations(dir: &std::path::Path) -> Result<std::path::PathBuf, BuildError> {
    let flags = ORCHESTRATION_CFLAGS;
    write_orchestration_sources(dir)?;
    let out = dir.join(ORCHESTRATION_OBJECT);
    let mut args: Vec<std::ffi::OsString> = vec!["-shared".into(), "-o".into(), out.clone().into()];
    args.extend(ORCHESTRATION_SOURCES.iter().map(|(f, _)| dir.join(f).into()));
    host_compile(false, &flags, &args)?;
    Ok(out)
}

/// Writes [`ORCHESTRATION_FILES`] into `dir` (feature `host-build`), for a host or a cross build.
#[cfg(feature = "host-build")]
pub fn write_orchestration_sources(dir: &std::path::Path) -> Result<(), BuildError> {
    write_sources(dir, &ORCHESTRATION_FILES)
}

/// The entry every test kernel object defines.
pub const KERNEL_ENTRY: &str = "kernel_entry";

/// Compiles every [`BUILT_KERNELS`] source for the host into its own shared object
/// `lib<name>.so` in `dir` (feature `host-build`), exporting [`KERNEL_ENTRY`]; returns
/// (kernel, path) in [`BUILT_KERNELS`] order.
#[cfg(feature = "host-build")]
pub fn build_host_kernels(
    dir: &std::path::Path,
) -> Result<Vec<(TestKernel, std::path::PathBuf)>, BuildError> {
    let flags =
        ["-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-fno-exceptions", "-fno-rtti"];
    let mut sources = vec![KERNEL_ABI_HEADER];
    sources.extend(BUILT_KERNELS.iter().map(|k| (k.file, k.source)));
    write_sources(dir, &sources)?;
    let mut out = Vec::new();
    for k in BUILT_KERNELS {
        let so = dir.join(format!("lib{}.so", k.name));
        host_compile(
            true,
            &flags,
            &["-shared".into(), "-o".into(), so.clone().into(), dir.join(k.file).into()],
        )?;
        out.push((k, so));
    }
    Ok(out)
}

/// Compiles the bootstrap dispatcher for the host into a shared object in `dir`, installing
/// programs into `install_dir` instead of the device path (feature `host-build`).
#[cfg(feature = "host-build")]
pub fn build_host_dispatcher(
    dir: &std::path::Path,
    install_dir: &std::path::Path,
) -> Result<std::path::PathBuf, BuildError> {
    let out = dir.join("libsimpler_aicpu_dispatcher.so");
    let define = format!("-D{INSTALL_DIR_DEFINE}=\"{}\"", install_dir.display());
    let flags = [
        "-std=c99",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-D_POSIX_C_SOURCE=200809L",
        define.as_str(),
    ];
    write_sources(dir, &[("dispatcher.c", DISPATCHER_SOURCE)])?;
    host_compile(
        false,
        &flags,
        &["-shared".into(), "-o".into(), out.clone().into(), dir.join("dispatcher.c").into()],
    )?;
    Ok(out)
}

/// Writes `sources` into `dir`.
#[cfg(feature = "host-build")]
fn write_sources(dir: &std::path::Path, sources: &[(&str, &str)]) -> Result<(), BuildError> {
    let write = |path: std::path::PathBuf| move |source| BuildError::Write { path, source };
    std::fs::create_dir_all(dir).map_err(write(dir.to_owned()))?;
    for (name, text) in sources {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(write(path))?;
    }
    Ok(())
}

/// Runs the host's C or C++ compiler with `flags`, position-independent code, and `args`.
#[cfg(feature = "host-build")]
fn host_compile(cpp: bool, flags: &[&str], args: &[std::ffi::OsString]) -> Result<(), BuildError> {
    let target = env!("SIMPLER_ONBOARD_PROGRAMS_TARGET");
    let compiler = cc::Build::new()
        .cpp(cpp)
        .target(target)
        .host(target)
        .opt_level(2)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .pic(true)
        .try_get_compiler()
        .map_err(|source| BuildError::NoCompiler {
            language: if cpp { "C++" } else { "C" },
            source,
        })?;
    let mut command = compiler.to_command();
    command.args(flags).arg("-fPIC").args(args);
    let line = format!("{command:?}");
    let output = match command.output() {
        Ok(output) => output,
        Err(source) => return Err(BuildError::Spawn { command: line, source }),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        return Err(BuildError::Compile { command: line, status: output.status, stderr });
    }
    Ok(())
}

/// The identity of the host compiler `build_host_*` uses (its `--version` first line), for
/// cache keys and manifests (feature `host-build`).
#[cfg(feature = "host-build")]
pub fn host_compiler_identity(cpp: bool) -> String {
    let target = env!("SIMPLER_ONBOARD_PROGRAMS_TARGET");
    let Ok(compiler) = cc::Build::new()
        .cpp(cpp)
        .target(target)
        .host(target)
        .opt_level(2)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .try_get_compiler()
    else {
        return "unknown".into();
    };
    let mut command = compiler.to_command();
    command.arg("--version");
    match command.output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_owned(),
        Err(_) => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_args_put_each_field_at_its_offset_and_leave_the_framework_part_zero() {
        let b = DeviceArgs { dispatcher: (1, 2), device_id: 3, program: (4, 5) }.to_bytes();
        assert!(b[..96].iter().all(|&x| x == 0));
        let q = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        assert_eq!([q(96), q(104), q(112), q(120), q(128)], [1, 2, 3, 4, 5]);
        assert!(b[136..].iter().all(|&x| x == 0));
    }

    #[test]
    fn codes_round_trip_and_unknown_values_are_kept() {
        for raw in -9..=0 {
            assert!(!matches!(DispatchCode::from_raw(raw), DispatchCode::Unknown(_)), "{raw}");
        }
        assert_eq!(DispatchCode::from_raw(-42), DispatchCode::Unknown(-42));
        assert_eq!(DispatchCode::from_raw(-42).to_string(), "unknown dispatcher code -42");
    }

    #[test]
    fn program_headers_placed_at_the_end_of_the_address_space_find_nothing() {
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x36] = 56; // phentsize
        elf[0x38] = 2; // phnum
        for phoff in [u64::MAX - 3, u64::MAX - 0x0f, u64::MAX - 56] {
            elf[0x20..0x28].copy_from_slice(&phoff.to_le_bytes());
            assert_eq!(build_id(&elf), None, "{phoff:#x}");
        }
    }

    #[test]
    fn an_object_without_a_build_id_is_fingerprinted_by_its_content() {
        assert_eq!(build_id(b"\x7fELF short"), None);
        assert_eq!(fingerprint(b"abc"), 0xe71fa2190541574b);
        assert_eq!(installed_name(0xab, 1), "simpler_inner_00000000000000ab_1.so");
    }
}
