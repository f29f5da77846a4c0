//! The glibc dynamic loader's cache, `/etc/ld.so.cache` (pure: bytes in, bytes out).
//!
//! Three programs need it: the node plugin reads a driver root's cache to find the driver's
//! libraries as `ldconfig` registered them (the container toolkit does the same), the CDI hook
//! adds the injected libraries to a container's cache so its loader finds `libcuda.so.1` whatever
//! the image's distribution, and the fake driver root tool writes one for its stand-ins.
//!
//! Format ("glibc-ld.so.cache1.1", written by `ldconfig` since glibc 2.32, read since 2.2):
//!
//! ```text
//! header (48 bytes): magic "glibc-ld.so.cache" "1.1", nlibs u32, len_strings u32, flags u8
//!                    (2 = little endian), 3 padding bytes, extension_offset u32, 3 unused u32
//! entries (24 bytes each): flags i32, key u32, value u32, osversion u32, hwcap u64
//! string table:      NUL-terminated names and paths; key/value are offsets from the header
//! extension:         magic 0xEAA42174, count u32, sections {tag, flags, offset, size} (u32 each);
//!                    tag 0 = generator (text), tag 1 = glibc-hwcaps (u32 string offsets)
//! ```
//!
//! Older files put the pre-2.2 format (`ld.so-1.7.0`) first and this one after it; both are read.
//! Entries are sorted by name, descending in the loader's own order ([`libcmp`]), because the
//! loader binary-searches them; among entries of one name it takes the first that fits (so a
//! library listed first wins). An entry whose `hwcap` has bit 62 set belongs to the
//! `glibc-hwcaps` subdirectory whose index is in its low 32 bits.
//!
//! Hand-written: no maintained crate reads and writes this format; the container toolkit has
//! its own reader too. Little-endian hosts only (x86-64, arm64), as the flags say.

use std::cmp::Ordering;
use std::collections::BTreeMap;

const MAGIC_NEW: &[u8] = b"glibc-ld.so.cache1.1";
const MAGIC_OLD: &[u8] = b"ld.so-1.7.0";
const HEADER_SIZE: usize = 48;
const ENTRY_SIZE: usize = 24;
const OLD_ENTRY_SIZE: usize = 12;
const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
const TAG_GENERATOR: u32 = 0;
const TAG_GLIBC_HWCAPS: u32 = 1;
const FLAGS_LITTLE_ENDIAN: u8 = 2;
/// `hwcap` bits marking an entry of a glibc-hwcaps subdirectory.
const HWCAP_EXTENSION: u64 = 1 << 62;

/// `FLAG_ELF_LIBC6`: a glibc ELF library.
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`.
pub const FLAG_X8664_LIB64: i32 = 0x0300;
/// `FLAG_AARCH64_LIB64`.
pub const FLAG_AARCH64_LIB64: i32 = 0x0a00;
const FLAG_TYPE_MASK: i32 = 0x00ff;
const FLAG_ARCH_MASK: i32 = 0xff00;

/// The entry flags of a 64-bit glibc library of the architecture this program was built for.
pub fn native_library_flags() -> i32 {
    if cfg!(target_arch = "aarch64") {
        FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64
    } else {
        FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
    }
}

/// One library the loader can find by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Type and architecture (`FLAG_*`).
    pub flags: i32,
    /// The name a program asks for, e.g. `libcuda.so.1`.
    pub name: String,
    /// The file the loader opens, e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub path: String,
    /// Unused by current glibc; kept as read.
    pub osversion: u32,
    /// Hardware capabilities; see the module docs for glibc-hwcaps entries.
    pub hwcap: u64,
}

impl Entry {
    /// A 64-bit library of this program's architecture.
    pub fn native(name: impl Into<String>, path: impl Into<String>) -> Self {
        Entry {
            flags: native_library_flags(),
            name: name.into(),
            path: path.into(),
            osversion: 0,
            hwcap: 0,
        }
    }

    /// Whether this is a 64-bit library (x86-64, arm64 or ppc64le), the kind the toolkit and
    /// Tessera inject.
    pub fn is_64bit_library(&self) -> bool {
        self.flags & FLAG_TYPE_MASK & FLAG_ELF_LIBC6 != 0
            && matches!(self.flags & FLAG_ARCH_MASK, 0x0300 | 0x0a00 | 0x0500)
    }
}

/// A parsed cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LdCache {
    /// The entries, in the file's order.
    pub entries: Vec<Entry>,
    /// Names of the glibc-hwcaps subdirectories entries refer to by index.
    pub hwcaps_subdirs: Vec<String>,
    /// Who wrote the file (`ldconfig (GNU libc) ...`), if it says.
    pub generator: Option<String>,
}

/// Why bytes are not a cache this module can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LdCacheError {
    #[error("not an ld.so.cache: no `glibc-ld.so.cache1.1` header")]
    NoHeader,
    #[error("the ld.so.cache is big-endian or of unknown byte order (flags {0})")]
    ByteOrder(u8),
    #[error("the ld.so.cache is truncated: {0}")]
    Truncated(&'static str),
    #[error("the ld.so.cache has a string offset {0} outside the file")]
    BadString(u32),
}

fn u32_at(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, LdCacheError> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(LdCacheError::Truncated(what))
}

fn u64_at(bytes: &[u8], at: usize, what: &'static str) -> Result<u64, LdCacheError> {
    let low = u32_at(bytes, at, what)? as u64;
    let high = u32_at(bytes, at + 4, what)? as u64;
    Ok(low | (high << 32))
}

/// The NUL-terminated string at `offset` of `table`.
fn string_at(table: &[u8], offset: u32) -> Result<String, LdCacheError> {
    let rest = table
        .get(offset as usize..)
        .ok_or(LdCacheError::BadString(offset))?;
    let end = rest
        .iter()
        .position(|b| *b == 0)
        .ok_or(LdCacheError::BadString(offset))?;
    Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Where the new-format header starts: at 0, or after an old-format part.
fn new_header_start(bytes: &[u8]) -> Result<usize, LdCacheError> {
    if bytes.starts_with(MAGIC_NEW) {
        return Ok(0);
    }
    if !bytes.starts_with(MAGIC_OLD) {
        return Err(LdCacheError::NoHeader);
    }
    // Old header: magic + NUL (12 bytes), nlibs u32, then 12-byte entries; the new part
    // follows, aligned to 8 bytes.
    let old_count = u32_at(bytes, MAGIC_OLD.len() + 1, "old header")? as usize;
    let end = MAGIC_OLD.len() + 1 + 4 + old_count * OLD_ENTRY_SIZE;
    let start = end.next_multiple_of(8);
    if bytes.get(start..).is_some_and(|b| b.starts_with(MAGIC_NEW)) {
        Ok(start)
    } else {
        Err(LdCacheError::NoHeader)
    }
}

impl LdCache {
    /// Reads a cache file's bytes.
    pub fn parse(bytes: &[u8]) -> Result<LdCache, LdCacheError> {
        let data = &bytes[new_header_start(bytes)?..];
        if data.len() < HEADER_SIZE {
            return Err(LdCacheError::Truncated("header"));
        }
        let count = u32_at(data, 20, "header")? as usize;
        let byte_order = data[28];
        if byte_order != 0 && byte_order != FLAGS_LITTLE_ENDIAN {
            return Err(LdCacheError::ByteOrder(byte_order));
        }
        let extension_offset = u32_at(data, 32, "header")? as usize;
        let mut entries = Vec::with_capacity(count.min(data.len() / ENTRY_SIZE));
        for i in 0..count {
            let at = HEADER_SIZE + i * ENTRY_SIZE;
            if data.len() < at + ENTRY_SIZE {
                return Err(LdCacheError::Truncated("entries"));
            }
            entries.push(Entry {
                flags: u32_at(data, at, "entries")? as i32,
                name: string_at(data, u32_at(data, at + 4, "entries")?)?,
                path: string_at(data, u32_at(data, at + 8, "entries")?)?,
                osversion: u32_at(data, at + 12, "entries")?,
                hwcap: u64_at(data, at + 16, "entries")?,
            });
        }
        let mut cache = LdCache {
            entries,
            ..LdCache::default()
        };
        if extension_offset != 0 {
            cache.read_extension(data, extension_offset)?;
        }
        Ok(cache)
    }

    fn read_extension(&mut self, data: &[u8], at: usize) -> Result<(), LdCacheError> {
        if u32_at(data, at, "extension")? != EXTENSION_MAGIC {
            // Not an extension glibc would use either: ignore it, as the loader does.
            return Ok(());
        }
        let count = u32_at(data, at + 4, "extension")? as usize;
        for i in 0..count {
            let section = at + 8 + i * 16;
            let tag = u32_at(data, section, "extension section")?;
            let offset = u32_at(data, section + 8, "extension section")? as usize;
            let size = u32_at(data, section + 12, "extension section")? as usize;
            let body = data
                .get(offset..offset + size)
                .ok_or(LdCacheError::Truncated("extension section"))?;
            match tag {
                TAG_GENERATOR => {
                    self.generator = Some(String::from_utf8_lossy(body).into_owned());
                }
                TAG_GLIBC_HWCAPS => {
                    for chunk in body.chunks_exact(4) {
                        let offset = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                        self.hwcaps_subdirs.push(string_at(data, offset)?);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The 64-bit libraries, without glibc-hwcaps variants: `(name, path)` in file order.
    pub fn libraries(&self) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .filter(|e| e.is_64bit_library() && e.hwcap & HWCAP_EXTENSION == 0)
    }

    /// Puts `entries` in front of every existing entry of the same name (so the loader picks
    /// them), dropping existing entries with the same name *and* path.
    pub fn prefer(&mut self, entries: Vec<Entry>) {
        self.entries.retain(|old| {
            !entries
                .iter()
                .any(|new| new.name == old.name && new.path == old.path)
        });
        let mut merged = entries;
        merged.append(&mut self.entries);
        self.entries = merged;
    }

    /// The file's bytes, entries sorted as the loader needs (descending [`libcmp`]; entries of
    /// one name keep their order).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut entries: Vec<&Entry> = self.entries.iter().collect();
        entries.sort_by(|a, b| libcmp(&b.name, &a.name));

        let strings_start = HEADER_SIZE + entries.len() * ENTRY_SIZE;
        let mut strings = Strings::new(strings_start);
        let offsets: Vec<(u32, u32)> = entries
            .iter()
            .map(|e| (strings.add(&e.name), strings.add(&e.path)))
            .collect();
        let hwcaps: Vec<u32> = self
            .hwcaps_subdirs
            .iter()
            .map(|dir| strings.add(dir))
            .collect();
        let table = strings.bytes;

        let mut out = Vec::with_capacity(strings_start + table.len() + 64);
        out.extend_from_slice(MAGIC_NEW);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(table.len() as u32).to_le_bytes());
        out.push(FLAGS_LITTLE_ENDIAN);
        out.extend_from_slice(&[0; 3]);
        let extension_offset_at = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&[0; 12]);
        for (entry, (key, value)) in entries.iter().zip(&offsets) {
            out.extend_from_slice(&entry.flags.to_le_bytes());
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
            out.extend_from_slice(&entry.osversion.to_le_bytes());
            out.extend_from_slice(&entry.hwcap.to_le_bytes());
        }
        out.extend_from_slice(&table);

        let mut sections: Vec<(u32, Vec<u8>)> = Vec::new();
        if let Some(generator) = &self.generator {
            sections.push((TAG_GENERATOR, generator.as_bytes().to_vec()));
        }
        if !hwcaps.is_empty() {
            sections.push((
                TAG_GLIBC_HWCAPS,
                hwcaps.iter().flat_map(|o| o.to_le_bytes()).collect(),
            ));
        }
        if !sections.is_empty() {
            while !out.len().is_multiple_of(4) {
                out.push(0);
            }
            let extension_at = out.len();
            out[extension_offset_at..extension_offset_at + 4]
                .copy_from_slice(&(extension_at as u32).to_le_bytes());
            out.extend_from_slice(&EXTENSION_MAGIC.to_le_bytes());
            out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
            let mut body_at = extension_at + 8 + sections.len() * 16;
            for (tag, body) in &sections {
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
                out.extend_from_slice(&(body_at as u32).to_le_bytes());
                out.extend_from_slice(&(body.len() as u32).to_le_bytes());
                body_at += body.len().next_multiple_of(4);
            }
            for (_, body) in &sections {
                out.extend_from_slice(body);
                while !out.len().is_multiple_of(4) {
                    out.push(0);
                }
            }
        }
        out
    }
}

/// The string table being built: each distinct string once.
struct Strings {
    start: usize,
    bytes: Vec<u8>,
    seen: BTreeMap<String, u32>,
}

impl Strings {
    fn new(start: usize) -> Self {
        Strings {
            start,
            bytes: Vec::new(),
            seen: BTreeMap::new(),
        }
    }

    fn add(&mut self, text: &str) -> u32 {
        if let Some(offset) = self.seen.get(text) {
            return *offset;
        }
        let offset = (self.start + self.bytes.len()) as u32;
        self.bytes.extend_from_slice(text.as_bytes());
        self.bytes.push(0);
        self.seen.insert(text.to_owned(), offset);
        offset
    }
}

/// The loader's name order (glibc's `_dl_cache_libcmp`): runs of digits compare as numbers,
/// a digit sorts after any other character, other characters compare as bytes.
pub fn libcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() {
        if a[i].is_ascii_digit() {
            if j >= b.len() || !b[j].is_ascii_digit() {
                return Ordering::Greater;
            }
            let (mut x, mut y) = (0u64, 0u64);
            while i < a.len() && a[i].is_ascii_digit() {
                x = x.saturating_mul(10).saturating_add(u64::from(a[i] - b'0'));
                i += 1;
            }
            while j < b.len() && b[j].is_ascii_digit() {
                y = y.saturating_mul(10).saturating_add(u64::from(b[j] - b'0'));
                j += 1;
            }
            if x != y {
                return x.cmp(&y);
            }
        } else if j < b.len() && b[j].is_ascii_digit() {
            return Ordering::Less;
        } else if j >= b.len() {
            return Ordering::Greater;
        } else if a[i] != b[j] {
            return a[i].cmp(&b[j]);
        } else {
            i += 1;
            j += 1;
        }
    }
    if j < b.len() {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    #[test]
    fn names_order_like_the_loader() {
        assert_eq!(libcmp("libc.so.6", "libc.so.6"), Ordering::Equal);
        assert_eq!(libcmp("libfoo.so.10", "libfoo.so.9"), Ordering::Greater);
        assert_eq!(libcmp("libfoo.so.1", "libfoo.so"), Ordering::Greater);
        assert_eq!(libcmp("libfoo.so", "libfoo.so.1"), Ordering::Less);
        assert_eq!(libcmp("liba.so", "libb.so"), Ordering::Less);
        // A digit sorts after a letter.
        assert_eq!(libcmp("lib1.so", "liba.so"), Ordering::Greater);
        assert_eq!(libcmp("liba.so", "lib1.so"), Ordering::Less);
    }

    fn sample() -> LdCache {
        LdCache {
            entries: vec![
                Entry::native("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
                Entry::native("libcuda.so.1", "/usr/lib64/libcuda.so.1"),
                Entry {
                    hwcap: HWCAP_EXTENSION,
                    ..Entry::native("libz.so.1", "/usr/lib/glibc-hwcaps/x86-64-v3/libz.so.1")
                },
                Entry::native("libz.so.1", "/usr/lib/libz.so.1"),
            ],
            hwcaps_subdirs: vec!["x86-64-v3".into()],
            generator: Some("ldconfig (GNU libc) test".into()),
        }
    }

    #[test]
    fn written_caches_read_back() {
        let cache = sample();
        let bytes = cache.to_bytes();
        let back = LdCache::parse(&bytes).unwrap();
        assert_eq!(back.hwcaps_subdirs, cache.hwcaps_subdirs);
        assert_eq!(back.generator, cache.generator);
        let names: Vec<&str> = back.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["libz.so.1", "libz.so.1", "libcuda.so.1", "libc.so.6"]
        );
        assert_eq!(
            back.entries[0].hwcap, HWCAP_EXTENSION,
            "equal names keep their order"
        );
        assert_eq!(
            back.libraries().count(),
            3,
            "hwcaps variants are not listed"
        );
        assert_eq!(LdCache::parse(&back.to_bytes()).unwrap(), back);
    }

    #[test]
    fn preferred_entries_come_first_among_equal_names() {
        let mut cache = sample();
        cache.prefer(vec![
            Entry::native("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Entry::native("libcuda.so.1", "/usr/lib64/libcuda.so.1"),
        ]);
        let back = LdCache::parse(&cache.to_bytes()).unwrap();
        let cuda: Vec<&str> = back
            .entries
            .iter()
            .filter(|e| e.name == "libcuda.so.1")
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(
            cuda,
            vec![
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib64/libcuda.so.1"
            ],
            "the duplicate of an existing entry is kept once, in front"
        );
    }

    #[test]
    fn bad_bytes_are_errors_not_panics() {
        assert_eq!(LdCache::parse(b""), Err(LdCacheError::NoHeader));
        assert_eq!(LdCache::parse(b"hello world"), Err(LdCacheError::NoHeader));
        let bytes = sample().to_bytes();
        for cut in [10, 30, 60, 100] {
            assert!(LdCache::parse(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut corrupt = bytes.clone();
        // First entry's key offset points far outside.
        corrupt[HEADER_SIZE + 4..HEADER_SIZE + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            LdCache::parse(&corrupt),
            Err(LdCacheError::BadString(_))
        ));
    }

    #[test]
    fn old_format_prefix_is_skipped() {
        let new = sample().to_bytes();
        let mut bytes = MAGIC_OLD.to_vec();
        bytes.push(0);
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&[0; OLD_ENTRY_SIZE]);
        while !bytes.len().is_multiple_of(8) {
            bytes.push(0);
        }
        bytes.extend_from_slice(&new);
        assert_eq!(
            LdCache::parse(&bytes).unwrap(),
            LdCache::parse(&new).unwrap()
        );
    }
}
