//! The onboard AICPU program's side of the launches: the init and exec entries behind the C
//! symbols of the program crate, and [`MmioPlatform`], the [`AicpuPlatform`] over a chip's
//! register windows (`docs/onboard-programs.md`).
//!
//! Register access is a 32-bit load or store of the word at `window + offset`, done as a relaxed
//! atomic access (one plain load or store instruction, never merged or elided) rather than a
//! volatile one, because when the simulator runs this program the same word is an atomic cell
//! other threads access concurrently. The barriers the protocol needs are explicit fences: a
//! release fence (write barrier) before every store, so the payload a token publishes is visible
//! before the token, and an acquire fence (read barrier) after every load, so what a core wrote
//! before its `COND` report is read after it. At exec start the program invalidates its data
//! cache over the argument block and the runtime image the host wrote.

// Compiled only for the program crate (feature `aicpu-program`).
#![cfg(feature = "aicpu-program")]

mod register;

pub use self::register::register_entry;

use core::fmt;
use core::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence};

use super::text::FixedText;
use super::view::ImageView;
use super::{AicpuPlatform, LogLevel, exec};
use crate::abi::launch::{InitArgs, KernelArgs};
use crate::abi::regs::RegId;
use crate::abi::services::HostServices;
use crate::abi::{ABI_VERSION, MAX_LAUNCH_CORES, PHYSICAL_CORE_LIMIT};

/// Entry result: the argument block or the image names another ABI version, or is malformed.
pub const ENTRY_BAD_ARGS: i32 = 3;

/// The init arguments of the latest init entry (one program per device and die onboard).
struct StoredInit {
    words: [AtomicU32; 6],
    dma: [AtomicU64; 2],
}

static INIT: StoredInit =
    StoredInit { words: [const { AtomicU32::new(0) }; 6], dma: [const { AtomicU64::new(0) }; 2] };

impl StoredInit {
    fn store(&self, a: &InitArgs) {
        let w = [
            a.abi_version,
            a.device_id,
            a.log_level,
            a.scheduler_timeout_ms,
            a.shutdown_budget_ms,
            a.tensor_wait_ms,
        ];
        for (cell, v) in self.words.iter().zip(w) {
            cell.store(v, Ordering::Relaxed);
        }
        for (cell, v) in self.dma.iter().zip(a.dma_workspace) {
            cell.store(v, Ordering::Relaxed);
        }
        // Publishes the words to the exec threads of later launches.
        fence(Ordering::Release);
    }

    fn load(&self) -> InitArgs {
        fence(Ordering::Acquire);
        let w = |i: usize| self.words[i].load(Ordering::Relaxed);
        InitArgs {
            abi_version: w(0),
            device_id: w(1),
            log_level: w(2),
            scheduler_timeout_ms: w(3),
            shutdown_budget_ms: w(4),
            tensor_wait_ms: w(5),
            dma_workspace: [
                self.dma[0].load(Ordering::Relaxed),
                self.dma[1].load(Ordering::Relaxed),
            ],
        }
    }
}

/// The init entry: keeps the runner's init arguments for the exec launches.
///
/// # Safety
///
/// `args` must point at a readable [`InitArgs`] (the launch's argument bytes; no alignment is
/// assumed).
pub unsafe fn init_entry(args: *const u8) -> i32 {
    if args.is_null() {
        return ENTRY_BAD_ARGS;
    }
    // SAFETY: the caller guarantees `size_of::<InitArgs>()` readable bytes.
    let a = unsafe { args.cast::<InitArgs>().read_unaligned() };
    if a.abi_version != ABI_VERSION {
        return ENTRY_BAD_ARGS;
    }
    INIT.store(&a);
    0
}

/// The exec entry of one AICPU thread: claims a thread index, then runs the scheduler.
///
/// # Safety
///
/// `args` must point at the launch's argument bytes: the device address of a [`KernelArgs`]
/// (8 bytes, no alignment assumed). That block, its runtime image, its register table (an
/// entry per physical core id below `PHYSICAL_CORE_LIMIT`) and every register window the table
/// names must be valid device memory for the whole launch, laid out as the ABI describes; a
/// non-zero `host_services` must point at a [`HostServices`] table that stays valid for the
/// launch.
pub unsafe fn exec_entry(args: *const u8) -> i32 {
    if args.is_null() {
        return ENTRY_BAD_ARGS;
    }
    // SAFETY: the caller guarantees 8 readable argument bytes.
    let ka_addr = unsafe { args.cast::<u64>().read_unaligned() };
    let ka_ptr = ka_addr as *const KernelArgs;
    invalidate(ka_ptr.cast(), size_of::<KernelArgs>());
    // SAFETY: the caller guarantees a readable `KernelArgs` at that address.
    let ka = unsafe { ka_ptr.read_unaligned() };
    if ka.abi_version != ABI_VERSION || ka.regs_table == 0 {
        return ENTRY_BAD_ARGS;
    }
    invalidate(ka.image_base as *const u8, ka.image_len as usize);
    // SAFETY: the caller guarantees the image is valid device memory for the launch.
    let Ok(view) = (unsafe { ImageView::from_raw(ka.image_base as *mut u8, ka.image_len) }) else {
        return ENTRY_BAD_ARGS;
    };
    // SAFETY: zero or a table valid for the launch (the caller's guarantee).
    let services = unsafe { (ka.host_services as *const HostServices).as_ref() };
    let threads = view.header().aicpu_threads.clamp(1, crate::abi::MAX_AICPU_THREADS);
    let thread = view.shared().aicpu_claim.fetch_add(1, Ordering::AcqRel) % threads;
    let init = services.map_or_else(|| INIT.load(), |s| s.init);
    let platform = MmioPlatform::new(ka.regs_table as *const u64, ka.num_aicore, thread, services);
    exec(&platform, &init, &view, thread)
}

/// Invalidates the data cache over `[addr, addr + len)`, so data the host wrote is read from
/// memory. A no-op where the host is the CPU running this code (the simulator).
fn invalidate(addr: *const u8, len: usize) {
    #[cfg(target_arch = "aarch64")]
    {
        const LINE: usize = 64;
        let mut line = addr as usize & !(LINE - 1);
        let end = addr as usize + len;
        while line < end {
            // SAFETY: `dc civac` cleans and invalidates one cache line by address; it reads or
            // writes no memory visible to Rust and is permitted at EL0 on the AICPU OS.
            unsafe { core::arch::asm!("dc civac, {0}", in(reg) line, options(nostack)) };
            line += LINE;
        }
        // SAFETY: a barrier instruction; no memory operands.
        unsafe { core::arch::asm!("dsb ish", options(nostack)) };
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = (addr, len);
        fence(Ordering::Acquire);
    }
}

/// The AICPU platform over the chip: register windows by address, the system counter, bounded
/// spins; host services when a host runs the program.
pub struct MmioPlatform<'a> {
    regs_table: *const u64,
    cores: u32,
    thread: u32,
    services: Option<&'a HostServices>,
    /// The physical core id each owned core reported at its handshake ([`UNMAPPED`] before).
    physical: [AtomicU8; MAX_LAUNCH_CORES],
}

/// A core whose physical id is not known yet.
const UNMAPPED: u8 = u8::MAX;

impl<'a> MmioPlatform<'a> {
    fn new(
        regs_table: *const u64,
        cores: u32,
        thread: u32,
        services: Option<&'a HostServices>,
    ) -> MmioPlatform<'a> {
        let physical = [const { AtomicU8::new(UNMAPPED) }; MAX_LAUNCH_CORES];
        MmioPlatform { regs_table, cores, thread, services, physical }
    }

    /// The register-table entry of `core`: its physical core id once its handshake reported
    /// one. Before that only a host that runs the program (whose physical ids are the core
    /// indices) has an entry for it: on a chip the core's window is not known yet.
    fn table_index(&self, core: u32) -> Option<u32> {
        if core >= self.cores {
            return None;
        }
        match self.physical.get(core as usize)?.load(Ordering::Relaxed) {
            UNMAPPED => self.services.map(|_| core),
            physical => Some(u32::from(physical)),
        }
    }

    fn cell(&self, core: u32, reg: RegId) -> Option<&AtomicU32> {
        let index = self.table_index(core)?;
        // SAFETY: the register table holds an entry for every physical core id below
        // PHYSICAL_CORE_LIMIT (exec's contract), which bounds both a mapped id (`map_core`)
        // and a core index (below the 72 entries of `physical`, checked above).
        let window = unsafe { self.regs_table.add(index as usize).read() };
        if window == 0 {
            return None;
        }
        let addr = (window + u64::from(reg.mmio_offset())) as *mut u32;
        // SAFETY: a register word of a live window (exec's contract), 4-byte aligned by the
        // offsets' definition; every access to it is atomic.
        Some(unsafe { AtomicU32::from_ptr(addr) })
    }
}

/// A log or fault line handed to the host services; longer lines are cut.
type LogLine = FixedText<240>;

impl AicpuPlatform for MmioPlatform<'_> {
    fn reg_load(&self, core: u32, reg: RegId) -> u32 {
        let v = self.cell(core, reg).map_or(0, |c| c.load(Ordering::Relaxed));
        // Read barrier: what the core wrote before this register is read after it.
        fence(Ordering::Acquire);
        v
    }

    fn reg_store(&self, core: u32, reg: RegId, value: u32) {
        // Write barrier: the payload and handshake fields are visible before the register.
        fence(Ordering::Release);
        if let Some(c) = self.cell(core, reg) {
            c.store(value, Ordering::Relaxed);
        }
        if let Some(s) = self.services {
            // SAFETY: the table came with this exec call, whose `ctx` its functions take.
            unsafe { (s.notify_core)(s.ctx, core) };
        }
    }

    fn counter(&self) -> u64 {
        match self.services {
            // SAFETY: the table came with this exec call, whose `ctx` its functions take.
            Some(s) => unsafe { (s.counter)(s.ctx) },
            None => system_counter(),
        }
    }

    fn wait_epoch(&self) -> u64 {
        // SAFETY: the table came with this exec call, whose `ctx` its functions take.
        self.services.map_or(0, |s| unsafe { (s.wait_epoch)(s.ctx, self.thread) })
    }

    fn idle_wait(&self, observed: u64, round: u32, deadline: u64) {
        match self.services {
            // SAFETY: the table came with this exec call, whose `ctx` its functions take.
            Some(s) => unsafe { (s.idle_wait)(s.ctx, self.thread, observed, round, deadline) },
            None => {
                for _ in 0..1u32 << round.min(6) {
                    core::hint::spin_loop();
                }
            }
        }
    }

    fn notify_schedulers(&self) {
        if let Some(s) = self.services {
            // SAFETY: the table came with this exec call, whose `ctx` its functions take.
            unsafe { (s.notify_schedulers)(s.ctx) };
        }
    }

    fn claim_core(&self, core: u32) {
        if let Some(s) = self.services {
            // SAFETY: the table came with this exec call, whose `ctx` its functions take.
            unsafe { (s.claim_core)(s.ctx, self.thread, core) };
        }
    }

    fn map_core(&self, core: u32, physical: u32) {
        // Only ids the table has an entry for (the handshake refuses the others first).
        if let Some(slot) = self.physical.get(core as usize)
            && physical < PHYSICAL_CORE_LIMIT
        {
            slot.store(physical as u8, Ordering::Relaxed);
        }
    }

    fn should_stop(&self) -> bool {
        // SAFETY: the table came with this exec call, whose `ctx` its functions take.
        self.services.is_some_and(|s| unsafe { (s.should_stop)(s.ctx) } != 0)
    }

    fn log(&self, level: LogLevel, args: fmt::Arguments<'_>) {
        // Onboard the log sink is not wired yet: lines are dropped (the latched status and
        // the fault records carry what the host reports).
        if let Some(s) = self.services {
            let line = LogLine::format(args);
            let text = line.as_bytes();
            let level = match level {
                LogLevel::Error => 0,
                LogLevel::Warn => 1,
                LogLevel::Info => 2,
                LogLevel::Debug => 3,
            };
            // SAFETY: the table came with this exec call, whose `ctx` its functions take;
            // `text` is `text.len()` readable bytes.
            unsafe { (s.log)(s.ctx, self.thread, level, text.as_ptr(), text.len()) };
        }
    }

    fn report_fault(&self, core: Option<u32>, args: fmt::Arguments<'_>) {
        if let Some(s) = self.services {
            let line = LogLine::format(args);
            let text = line.as_bytes();
            let core = core.map_or(-1, i64::from);
            // SAFETY: the table came with this exec call, whose `ctx` its functions take;
            // `text` is `text.len()` readable bytes.
            unsafe { (s.report_fault)(s.ctx, self.thread, core, text.as_ptr(), text.len()) };
        }
    }
}

/// The 50 MHz system counter (`CNTVCT_EL0` on the AICPU).
#[cfg(target_arch = "aarch64")]
fn system_counter() -> u64 {
    let v: u64;
    // SAFETY: reads the virtual counter register; no memory access.
    unsafe { core::arch::asm!("mrs {0}, cntvct_el0", out(reg) v, options(nomem, nostack)) };
    v
}

/// A host without host services (only a test harness): nanoseconds since first use, scaled
/// to 50 MHz.
#[cfg(not(target_arch = "aarch64"))]
fn system_counter() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let ns = ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64;
    ns / crate::abi::NS_PER_TICK
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 75 fake control windows, big enough for every register's offset.
    fn windows() -> Vec<Vec<AtomicU32>> {
        let words = (RegId::Cond.mmio_offset() as usize / 4) + 1;
        (0..PHYSICAL_CORE_LIMIT).map(|_| (0..words).map(|_| AtomicU32::new(0)).collect()).collect()
    }

    fn word(w: &[Vec<AtomicU32>], window: usize, reg: RegId) -> u32 {
        w[window][reg.mmio_offset() as usize / 4].load(Ordering::Relaxed)
    }

    #[test]
    fn a_cores_registers_are_the_window_of_the_physical_id_it_reported() {
        let w = windows();
        let table: Vec<u64> = w.iter().map(|win| win.as_ptr() as u64).collect();
        let p = MmioPlatform::new(table.as_ptr(), 6, 0, None);
        // On a chip a core has no window before its handshake named its physical id.
        p.reg_store(1, RegId::DataMainBaseLow, 7);
        assert!((0..w.len()).all(|i| word(&w, i, RegId::DataMainBaseLow) == 0));
        // Core 1 (an AIV at block_dim 1) runs on physical core 40.
        p.map_core(1, 40);
        p.reg_store(1, RegId::DataMainBaseLow, 9);
        assert_eq!(word(&w, 40, RegId::DataMainBaseLow), 9);
        assert_eq!(word(&w, 1, RegId::DataMainBaseLow), 0, "not the window at the core index");
        w[40][RegId::Cond.mmio_offset() as usize / 4].store(5, Ordering::Relaxed);
        assert_eq!(p.reg_load(1, RegId::Cond), 5);
        // An id past the table, or a core past the launch, reaches no window.
        p.map_core(2, PHYSICAL_CORE_LIMIT);
        p.reg_store(2, RegId::DataMainBaseLow, 3);
        p.map_core(6, 10);
        p.reg_store(6, RegId::DataMainBaseLow, 3);
        assert!((0..w.len()).all(|i| i == 40 || word(&w, i, RegId::DataMainBaseLow) == 0));
    }
}
