//! Reading the little-endian ELF64 objects the device build produces: the section table, a
//! section's bytes and name, and C strings. Every offset is bounds-checked; a malformed object
//! is an error, never a panic.

/// A malformed object.
pub fn malformed() -> String {
    "not a well-formed little-endian ELF64 object".to_owned()
}

pub fn u16_at(b: &[u8], off: usize) -> Result<usize, String> {
    let bytes = b.get(off..off.checked_add(2).ok_or_else(malformed)?).ok_or_else(malformed)?;
    Ok(u16::from_le_bytes([bytes[0], bytes[1]]).into())
}

pub fn u32_at(b: &[u8], off: usize) -> Result<usize, String> {
    let bytes = b.get(off..off.checked_add(4).ok_or_else(malformed)?).ok_or_else(malformed)?;
    usize::try_from(u32::from_le_bytes(bytes.try_into().map_err(|_| malformed())?))
        .map_err(|_| malformed())
}

pub fn u64_at(b: &[u8], off: usize) -> Result<usize, String> {
    let bytes = b.get(off..off.checked_add(8).ok_or_else(malformed)?).ok_or_else(malformed)?;
    usize::try_from(u64::from_le_bytes(bytes.try_into().map_err(|_| malformed())?))
        .map_err(|_| malformed())
}

/// The NUL-terminated string at `off`.
pub fn c_str(b: &[u8], off: usize) -> Result<&str, String> {
    let rest = b.get(off..).ok_or_else(malformed)?;
    let end = rest.iter().position(|&c| c == 0).ok_or_else(malformed)?;
    std::str::from_utf8(&rest[..end]).map_err(|_| malformed())
}

/// One section header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: usize,
    pub kind: usize,
    pub offset: usize,
    pub size: usize,
    pub link: usize,
    pub info: usize,
}

/// Section types the build looks at.
pub const SHT_RELA: usize = 4;
pub const SHT_NOBITS: usize = 8;
pub const SHT_REL: usize = 9;
pub const SHT_GNU_VERNEED: usize = 0x6fff_fffe;

/// The section table of `elf` and the index of its section-name table.
pub fn sections(elf: &[u8]) -> Result<(Vec<Section>, usize), String> {
    if elf.len() < 64 || &elf[..4] != b"\x7fELF" || elf[4] != 2 || elf[5] != 1 {
        return Err(malformed());
    }
    let shoff = u64_at(elf, 0x28)?;
    let shentsize = u16_at(elf, 0x3a)?;
    let shnum = u16_at(elf, 0x3c)?;
    let shstrndx = u16_at(elf, 0x3e)?;
    if shnum > 0 && shentsize < 64 {
        return Err(malformed());
    }
    let mut out = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let sh = shoff.checked_add(i.checked_mul(shentsize).ok_or_else(malformed)?);
        let sh = sh.ok_or_else(malformed)?;
        out.push(Section {
            name: u32_at(elf, sh)?,
            kind: u32_at(elf, sh + 4)?,
            offset: u64_at(elf, sh + 24)?,
            size: u64_at(elf, sh + 32)?,
            link: u32_at(elf, sh + 40)?,
            info: u32_at(elf, sh + 44)?,
        });
    }
    Ok((out, shstrndx))
}

/// The bytes of `s` inside `elf`.
pub fn bytes<'a>(elf: &'a [u8], s: &Section) -> Result<&'a [u8], String> {
    elf.get(s.offset..s.offset.checked_add(s.size).ok_or_else(malformed)?).ok_or_else(malformed)
}
