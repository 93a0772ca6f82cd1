//! Register ids, the `COND` encoding and the reserved token values (`docs/device-handshake.md`).
//!
//! The AICPU talks to each AICore core through a handful of 32-bit registers. Onboard they
//! are MMIO words at fixed offsets of the core's control window; the simulator keeps one
//! `AtomicU32` cell per [`RegId`] per core. Either way the protocol only ever names a
//! register by its id.

/// One register of an AICore core's control window.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u32)]
pub enum RegId {
    /// Low half of `DATA_MAIN_BASE`: the dispatch token (AICPU → AICore).
    DataMainBaseLow = 0,
    /// High half of `DATA_MAIN_BASE`: the early-dispatch doorbell (AICPU → AICore).
    DataMainBaseHigh = 1,
    /// `COND`: acknowledge / finish reports (AICore → AICPU).
    Cond = 2,
    /// `FAST_PATH_ENABLE`: [`FAST_PATH_OPEN`] while a launch owns the core.
    FastPathEnable = 3,
    /// `CTRL`: control word (unused by the protocol, kept for the register table).
    Ctrl = 4,
}

impl RegId {
    /// Number of register ids; the simulator keeps this many cells per core.
    pub const COUNT: usize = 5;

    /// Every register id, in cell order.
    pub const ALL: [RegId; RegId::COUNT] = [
        RegId::DataMainBaseLow,
        RegId::DataMainBaseHigh,
        RegId::Cond,
        RegId::FastPathEnable,
        RegId::Ctrl,
    ];

    /// Byte offset of the register in an onboard control window.
    pub const fn mmio_offset(self) -> u32 {
        match self {
            RegId::DataMainBaseLow => 0xA0,
            RegId::DataMainBaseHigh => 0xA4,
            RegId::Cond => 0x4C8,
            RegId::FastPathEnable => 0x18,
            RegId::Ctrl => 0x0,
        }
    }

    /// Index of the register's cell in a simulated register block.
    pub const fn cell(self) -> usize {
        self as usize
    }
}

/// `FAST_PATH_ENABLE` value that opens a core's window.
pub const FAST_PATH_OPEN: u32 = 0xE;
/// `FAST_PATH_ENABLE` value that closes it again at shutdown.
pub const FAST_PATH_CLOSE: u32 = 0xF;

/// Bits of a token (bit 31 of `COND` is the state bit).
pub const TOKEN_MASK: u32 = 0x7FFF_FFFF;
/// `COND` state bit: set = FIN, clear = ACK.
pub const COND_FIN_BIT: u32 = 1 << 31;
/// First reserved token value; dispatch tokens stay below it.
pub const RESERVED_TOKEN_START: u32 = 0x7FFF_FFF0;
/// Reserved token: the AICore is idle (only ever reported as `FIN | AICORE_IDLE`).
pub const AICORE_IDLE: u32 = 0x7FFF_FFFF;
/// Reserved token: the AICore has exited (only ever reported as `FIN | AICORE_EXIT`).
pub const AICORE_EXIT: u32 = 0x7FFF_FFFE;
/// Reserved token written to the low half: the AICPU has opened the window and has no work.
pub const AICPU_IDLE: u32 = 0x7FFF_FFFD;
/// Reserved token written to the low half: leave the dispatch loop.
pub const EXIT_SIGNAL: u32 = 0x7FFF_FFF0;
/// `COND` value of a core that entered its dispatch loop and has run nothing yet.
pub const IDLE_VALUE: u32 = COND_FIN_BIT | AICORE_IDLE;
/// `COND` value of a core that answered the exit signal.
pub const EXITED_VALUE: u32 = COND_FIN_BIT | AICORE_EXIT;

/// A decoded `COND` register value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Cond(pub u32);

impl Cond {
    /// "Token `t` was picked up" (state bit clear).
    pub const fn ack(token: u32) -> Cond {
        Cond(token & TOKEN_MASK)
    }

    /// "Token `t` finished" (state bit set).
    pub const fn fin(token: u32) -> Cond {
        Cond(COND_FIN_BIT | (token & TOKEN_MASK))
    }

    /// Whether the state bit says FIN.
    pub const fn is_fin(self) -> bool {
        self.0 & COND_FIN_BIT != 0
    }

    /// The token the value reports.
    pub const fn token(self) -> u32 {
        self.0 & TOKEN_MASK
    }
}

/// Per-core token sequence of the dispatch protocol (`docs/device-handshake.md`).
///
/// Tokens are `seq & TOKEN_MASK`, skipping the reserved range `[0x7FFF_FFF0, 0x8000_0000)`: a
/// token in that range advances `seq` so the token wraps to 0. The skip is 16 values, an even
/// number, so the parity of consecutive tokens keeps alternating and `token & 1` keeps selecting
/// the other payload buffer of the pair.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TokenSeq {
    seq: u32,
}

impl TokenSeq {
    /// A sequence whose first token is 1.
    pub const fn new() -> TokenSeq {
        TokenSeq { seq: 0 }
    }

    /// A sequence that continues after `seq` (for tests of the wrap rule).
    pub const fn starting_after(seq: u32) -> TokenSeq {
        TokenSeq { seq }
    }

    /// The next dispatch token.
    pub fn next_token(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        let token = self.seq & TOKEN_MASK;
        if token >= RESERVED_TOKEN_START {
            // Jump to the next multiple of 2^31 so the token becomes 0.
            self.seq = self.seq.wrapping_add((TOKEN_MASK + 1) - token);
        }
        self.seq & TOKEN_MASK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_wrap_skips_the_reserved_range_and_keeps_parity() {
        let mut seq = TokenSeq::starting_after(RESERVED_TOKEN_START - 3);
        let tokens: Vec<u32> = (0..6).map(|_| seq.next_token()).collect();
        assert_eq!(tokens, vec![0x7FFF_FFEE, 0x7FFF_FFEF, 0, 1, 2, 3]);
        for pair in tokens.windows(2) {
            assert_ne!(pair[0] & 1, pair[1] & 1, "parity must alternate: {pair:?}");
        }
        assert!(tokens.iter().all(|&t| t < RESERVED_TOKEN_START));
    }

    #[test]
    fn token_wrap_also_works_across_the_u32_boundary() {
        let mut seq = TokenSeq::starting_after(u32::MAX - 2);
        let tokens: Vec<u32> = (0..4).map(|_| seq.next_token()).collect();
        assert_eq!(tokens, vec![0, 1, 2, 3]);
    }

    #[test]
    fn cond_encoding_puts_the_state_in_bit_31() {
        assert_eq!(Cond::ack(5).0, 5);
        assert_eq!(Cond::fin(5).0, 0x8000_0005);
        assert!(Cond::fin(5).is_fin());
        assert!(!Cond::ack(5).is_fin());
        assert_eq!(Cond::fin(5).token(), 5);
        assert_eq!(IDLE_VALUE, 0xFFFF_FFFF);
        assert_eq!(EXITED_VALUE, 0xFFFF_FFFE);
    }
}
