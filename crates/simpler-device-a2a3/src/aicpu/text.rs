//! A fixed-size text buffer for the AICPU side: formatting into it allocates nothing, and text
//! longer than its `N` bytes is cut at a character boundary.

use core::fmt::{self, Write};

/// Up to `N` bytes of UTF-8 text.
pub(crate) struct FixedText<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> FixedText<N> {
    /// `args` formatted, cut to `N` bytes.
    pub(crate) fn format(args: fmt::Arguments<'_>) -> Self {
        let mut t = FixedText { bytes: [0; N], len: 0 };
        // Writing never fails: text past the end is dropped.
        let _ = t.write_fmt(args);
        t
    }

    /// The text written, as bytes.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The whole buffer: the text, then zeros.
    pub(crate) fn padded(&self) -> &[u8; N] {
        &self.bytes
    }
}

impl<const N: usize> Write for FixedText<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = N - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FixedText;

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let t = FixedText::<5>::format(format_args!("ab{}", "çdé"));
        assert_eq!(t.as_bytes(), "abçd".as_bytes());
        let t = FixedText::<8>::format(format_args!("{}-{}", 1, 2));
        assert_eq!(t.as_bytes(), b"1-2");
    }
}
