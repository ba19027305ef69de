//! Just enough ELF and `ld.so.cache` reading to find the shared libraries a program loads,
//! the way the dynamic loader finds them: the program's interpreter (`PT_INTERP`), each
//! `DT_NEEDED` name searched in `DT_RPATH` (when there is no `DT_RUNPATH`), `DT_RUNPATH`,
//! the loader's cache and the default directories, keeping only a library of the
//! requester's class and machine. Nothing is executed: the files are only read.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Most program headers read from one file.
const PROGRAM_HEADERS_MAX_COUNT: usize = 512;
/// Largest dynamic section or string table read from one file.
const DYNAMIC_MAX_BYTES: u64 = 4 << 20;
/// Longest library name or search path read.
const NAME_MAX_BYTES: u64 = 4096;
/// Largest `ld.so.cache` read.
const LD_CACHE_MAX_BYTES: u64 = 64 << 20;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// What the loader needs to know about one ELF object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ElfDeps {
    /// `EI_CLASS`: 1 for 32-bit, 2 for 64-bit.
    pub class: u8,
    /// `e_machine`.
    pub machine: u16,
    /// `PT_INTERP`, for a dynamically linked program.
    pub interpreter: Option<String>,
    /// `DT_NEEDED` names, in order.
    pub needed: Vec<String>,
    /// `DT_RPATH` directories.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` directories.
    pub runpath: Vec<String>,
}

/// Whether `path` starts with the ELF magic (a cheap test before [`read_deps`]).
pub fn is_elf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    File::open(path)
        .and_then(|f| f.read_exact_at(&mut magic, 0))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

struct Reader {
    file: File,
    big_endian: bool,
    wide: bool,
}

impl Reader {
    fn bytes(&self, offset: u64, len: u64) -> io::Result<Vec<u8>> {
        if len > DYNAMIC_MAX_BYTES {
            return Err(bad("a section is larger than airlock reads"));
        }
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn u16_at(&self, b: &[u8], at: usize) -> io::Result<u16> {
        let s: [u8; 2] = b
            .get(at..at + 2)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("truncated"))?;
        Ok(if self.big_endian {
            u16::from_be_bytes(s)
        } else {
            u16::from_le_bytes(s)
        })
    }

    fn u32_at(&self, b: &[u8], at: usize) -> io::Result<u32> {
        let s: [u8; 4] = b
            .get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("truncated"))?;
        Ok(if self.big_endian {
            u32::from_be_bytes(s)
        } else {
            u32::from_le_bytes(s)
        })
    }

    fn u64_at(&self, b: &[u8], at: usize) -> io::Result<u64> {
        let s: [u8; 8] = b
            .get(at..at + 8)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| bad("truncated"))?;
        Ok(if self.big_endian {
            u64::from_be_bytes(s)
        } else {
            u64::from_le_bytes(s)
        })
    }

    /// A word: 8 bytes in a 64-bit object, 4 in a 32-bit one.
    fn word_at(&self, b: &[u8], at: usize) -> io::Result<u64> {
        if self.wide {
            self.u64_at(b, at)
        } else {
            self.u32_at(b, at).map(u64::from)
        }
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed ELF: {what}"))
}

struct Segment {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// Reads the loader-relevant facts of the ELF object at `path`.
pub fn read_deps(path: &Path) -> io::Result<ElfDeps> {
    let file = File::open(path)?;
    let mut ident = [0u8; 16];
    file.read_exact_at(&mut ident, 0)?;
    if ident[..4] != *b"\x7fELF" {
        return Err(bad("no ELF magic"));
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(bad("unknown class")),
    };
    let big_endian = match ident[5] {
        1 => false,
        2 => true,
        _ => return Err(bad("unknown byte order")),
    };
    let r = Reader {
        file,
        big_endian,
        wide,
    };
    let header = r.bytes(0, if wide { 64 } else { 52 })?;
    let machine = r.u16_at(&header, 18)?;
    let (phoff, phentsize, phnum) = if wide {
        (
            r.u64_at(&header, 32)?,
            r.u16_at(&header, 54)?,
            r.u16_at(&header, 56)?,
        )
    } else {
        (
            u64::from(r.u32_at(&header, 28)?),
            r.u16_at(&header, 42)?,
            r.u16_at(&header, 44)?,
        )
    };
    if usize::from(phnum) > PROGRAM_HEADERS_MAX_COUNT
        || usize::from(phentsize) < if wide { 56 } else { 32 }
    {
        return Err(bad("program header table"));
    }
    let table = r.bytes(phoff, u64::from(phentsize) * u64::from(phnum))?;
    let mut segments = Vec::new();
    for i in 0..usize::from(phnum) {
        let at = i * usize::from(phentsize);
        let segment = if wide {
            Segment {
                kind: r.u32_at(&table, at)?,
                offset: r.u64_at(&table, at + 8)?,
                vaddr: r.u64_at(&table, at + 16)?,
                filesz: r.u64_at(&table, at + 32)?,
            }
        } else {
            Segment {
                kind: r.u32_at(&table, at)?,
                offset: u64::from(r.u32_at(&table, at + 4)?),
                vaddr: u64::from(r.u32_at(&table, at + 8)?),
                filesz: u64::from(r.u32_at(&table, at + 16)?),
            }
        };
        segments.push(segment);
    }
    let mut deps = ElfDeps {
        class: ident[4],
        machine,
        ..ElfDeps::default()
    };
    if let Some(interp) = segments.iter().find(|s| s.kind == PT_INTERP) {
        let raw = r.bytes(interp.offset, interp.filesz)?;
        deps.interpreter = Some(c_string(&raw, 0)?);
    }
    let Some(dynamic) = segments.iter().find(|s| s.kind == PT_DYNAMIC) else {
        return Ok(deps);
    };
    let table = r.bytes(dynamic.offset, dynamic.filesz)?;
    let entry = if wide { 16 } else { 8 };
    let mut strtab = None;
    let mut strsz = None;
    let mut needed = Vec::new();
    let mut rpath = Vec::new();
    let mut runpath = Vec::new();
    let mut at = 0;
    while at + entry <= table.len() {
        let tag = r.word_at(&table, at)?;
        let value = r.word_at(&table, at + entry / 2)?;
        match tag {
            DT_NULL => break,
            DT_NEEDED => needed.push(value),
            DT_STRTAB => strtab = Some(value),
            DT_STRSZ => strsz = Some(value),
            DT_RPATH => rpath.push(value),
            DT_RUNPATH => runpath.push(value),
            _ => {}
        }
        at += entry;
    }
    let (Some(strtab), Some(strsz)) = (strtab, strsz) else {
        return Ok(deps);
    };
    // DT_STRTAB is an address: the loadable segment holding it gives its file offset.
    let load = segments
        .iter()
        .find(|s| s.kind == PT_LOAD && s.vaddr <= strtab && strtab < s.vaddr + s.filesz)
        .ok_or_else(|| bad("string table outside the loadable segments"))?;
    // Only the strings named, each read on its own: a big library's table (all its
    // exported symbols) runs to megabytes.
    let base = load.offset + (strtab - load.vaddr);
    let text = |offset: u64| -> io::Result<String> {
        if offset >= strsz {
            return Err(bad("string offset past the table"));
        }
        let len = (strsz - offset).min(NAME_MAX_BYTES);
        let mut buf = vec![0u8; len as usize];
        let n = r.file.read_at(&mut buf, base + offset)?;
        c_string(&buf[..n], 0)
    };
    for offset in needed {
        deps.needed.push(text(offset)?);
    }
    for offset in rpath {
        deps.rpath
            .extend(text(offset)?.split(':').map(str::to_owned));
    }
    for offset in runpath {
        deps.runpath
            .extend(text(offset)?.split(':').map(str::to_owned));
    }
    Ok(deps)
}

fn c_string(bytes: &[u8], at: usize) -> io::Result<String> {
    let tail = bytes.get(at..).ok_or_else(|| bad("string offset"))?;
    let end = tail
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| bad("unterminated string"))?;
    String::from_utf8(tail[..end].to_vec()).map_err(|_| bad("string is not UTF-8"))
}

/// The dynamic loader's cache (`/etc/ld.so.cache`, glibc's `glibc-ld.so.cache1.1` format):
/// library names and the paths they resolve to.
#[derive(Debug, Clone, Default)]
pub struct LdCache {
    entries: Vec<(String, String)>,
}

const NEW_CACHE_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_CACHE_MAGIC: &[u8] = b"ld.so-1.7.0";

impl LdCache {
    /// Reads the cache at `path`; a missing or unreadable cache is an empty one (the
    /// loader then searches its default directories, and so does [`resolve_library`]).
    pub fn read(path: &Path) -> Self {
        Self::parse(&std::fs::read(path).unwrap_or_default()).unwrap_or_default()
    }

    fn parse(data: &[u8]) -> Option<Self> {
        if data.len() as u64 > LD_CACHE_MAX_BYTES {
            return None;
        }
        let mut start = 0usize;
        if data.starts_with(OLD_CACHE_MAGIC) {
            // The old format first, then the new one aligned to 8 bytes.
            let n = u32::from_ne_bytes(data.get(12..16)?.try_into().ok()?) as usize;
            start = (16 + n * 12).next_multiple_of(8);
        }
        let new = data.get(start..)?;
        if !new.starts_with(NEW_CACHE_MAGIC) {
            return None;
        }
        let u32_at = |at: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(new.get(at..at + 4)?.try_into().ok()?))
        };
        let count = u32_at(20)? as usize;
        let string = |offset: u32| -> Option<String> {
            let tail = new.get(offset as usize..)?;
            let end = tail.iter().position(|b| *b == 0)?;
            String::from_utf8(tail[..end].to_vec()).ok()
        };
        let mut entries = Vec::with_capacity(count.min(1 << 16));
        for i in 0..count {
            let at = 48 + i * 24;
            let (Some(key), Some(value)) = (u32_at(at + 4), u32_at(at + 8)) else {
                break;
            };
            if let (Some(name), Some(path)) = (string(key), string(value)) {
                entries.push((name, path));
            }
        }
        Some(Self { entries })
    }

    /// Paths the cache gives for `name`, in the cache's order.
    pub fn lookup<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.entries
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, p)| p.as_str())
    }
}

/// The loader's default directories after the cache (glibc's trusted directories, with
/// the multiarch ones Debian adds).
pub fn default_library_dirs(machine: u16) -> Vec<PathBuf> {
    let triple = match machine {
        62 => Some("x86_64-linux-gnu"),
        183 => Some("aarch64-linux-gnu"),
        3 => Some("i386-linux-gnu"),
        _ => None,
    };
    let mut dirs = Vec::new();
    if let Some(t) = triple {
        dirs.push(PathBuf::from("/lib").join(t));
        dirs.push(PathBuf::from("/usr/lib").join(t));
    }
    for d in ["/lib64", "/usr/lib64", "/lib", "/usr/lib"] {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// Finds the library `name` that the object at `requester` (with `deps`) loads, as the
/// loader would; `None` when the loader would not find it either.
pub fn resolve_library(
    name: &str,
    requester: &Path,
    deps: &ElfDeps,
    cache: &LdCache,
) -> Option<PathBuf> {
    let fits = |path: &Path| {
        read_deps(path).is_ok_and(|d| d.class == deps.class && d.machine == deps.machine)
    };
    if name.contains('/') {
        let path = PathBuf::from(name);
        return fits(&path).then_some(path);
    }
    let origin = requester.parent().unwrap_or(Path::new("/"));
    let expand = |dir: &str| -> PathBuf {
        let dir = dir
            .replace("${ORIGIN}", &origin.to_string_lossy())
            .replace("$ORIGIN", &origin.to_string_lossy());
        PathBuf::from(dir)
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    if deps.runpath.is_empty() {
        dirs.extend(deps.rpath.iter().map(|d| expand(d)));
    }
    dirs.extend(deps.runpath.iter().map(|d| expand(d)));
    for dir in &dirs {
        let path = dir.join(name);
        if fits(&path) {
            return Some(path);
        }
    }
    for path in cache.lookup(name) {
        let path = Path::new(path);
        if fits(path) {
            return Some(path.to_owned());
        }
    }
    default_library_dirs(deps.machine)
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|path| fits(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shell_needs_libc_and_a_loader() {
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        let deps = read_deps(&sh).unwrap();
        assert_eq!(deps.class, 2);
        assert!(deps.interpreter.is_some(), "{deps:?}");
        assert!(
            deps.needed.iter().any(|n| n.starts_with("libc.so")),
            "{deps:?}"
        );
        let cache = LdCache::read(Path::new("/etc/ld.so.cache"));
        let libc = resolve_library("libc.so.6", &sh, &deps, &cache).expect("libc found");
        assert!(libc.exists());
    }

    #[test]
    fn the_cache_lists_libc() {
        let cache = LdCache::read(Path::new("/etc/ld.so.cache"));
        assert!(cache.lookup("libc.so.6").next().is_some());
        assert!(LdCache::parse(b"garbage").is_none());
    }

    #[test]
    fn non_elf_and_truncated_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        std::fs::write(&path, b"#!/bin/sh\n").unwrap();
        assert!(!is_elf(&path));
        assert!(read_deps(&path).is_err());
        std::fs::write(&path, b"\x7fELF\x02\x01\x01").unwrap();
        assert!(read_deps(&path).is_err());
        let mut header = vec![0u8; 64];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        header[56] = 0xff;
        header[57] = 0xff;
        std::fs::write(&path, &header).unwrap();
        assert!(read_deps(&path).is_err());
    }
}
