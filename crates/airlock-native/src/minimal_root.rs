//! The minimal host root (`rootfs = "host"`, issue 21): a prepared, read-only copy of only
//! what the policy's languages need, never the host's own inodes.
//!
//! What goes in: each language's interpreter (the first word of its command, found like
//! the job's `PATH` finds it, symlinks and all), a Python's standard library, the policy's
//! `site_packages`, the shared libraries all of those load (resolved as the dynamic loader
//! would, [`crate::elf`]), and what `policy/minimal_root.toml` lists with a reason each:
//! a few utilities, libraries loaded with `dlopen`, data (the C.UTF-8 locale, CA
//! certificates). `/etc` is synthesized into the copy. Nothing the toml's `never` list
//! names can be listed.
//!
//! The copy is made once per policy shape under airlock's cache directory, into a
//! temporary directory renamed into place under an exclusive lock (concurrent airlocks
//! wait for one another), and reused while the host files it came from keep their
//! identity (inode, size, modification time of every directory walked, every ELF object
//! and every directory an entry was taken from): a package upgrade renames files into
//! those directories, so a changed host is noticed and the copy made again. Jobs mount
//! it through a read-only overlayfs of their own ([`crate::plan::MountStep::Overlay`]),
//! so each job has its own superblock and inodes: an inotify watch or an `flock` inside a
//! job sees nothing of the host or of another job.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use airlock_core::policy::Policy;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::elf::{self, LdCache};
use crate::error::NativeError;
use crate::mount_plan;

/// The reviewed list of what the minimal root holds beyond the interpreters.
pub const MINIMAL_ROOT_TOML: &str = include_str!("../../../policy/minimal_root.toml");

/// Bumped when the layout of a prepared root changes, so older copies are not reused.
pub const FORMAT_VERSION: u32 = 2;

/// Where programs are looked up: the job's own `PATH` (airlock_core::job::BASE_ENV).
pub const JOB_PATH_DIRS: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// Most files in one prepared root (a `site_packages` pointing at `/usr` is refused by this).
pub const MINIMAL_ROOT_MAX_FILES: usize = 200_000;

/// Most bytes in one prepared root.
pub const MINIMAL_ROOT_MAX_BYTES: u64 = 8 << 30;

/// How long a backend trusts its prepared root before it checks the host again.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Age after which a replaced copy is removed: longer than the longest job
/// (`bounds::TIMEOUT_MAX`), whose overlay may still read from it.
pub const OLD_COPY_MAX_AGE: Duration = Duration::from_secs(25 * 3600);

/// Deepest symbolic link chain followed.
const SYMLINK_HOPS_MAX: usize = 40;

/// One entry of `policy/minimal_root.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedEntry {
    /// A program or library name.
    pub name: String,
    /// Why jobs need it.
    pub reason: String,
}

/// A data path of `policy/minimal_root.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataEntry {
    /// An absolute host path (a file or a directory, copied whole).
    pub path: PathBuf,
    /// Why jobs need it.
    pub reason: String,
}

/// `policy/minimal_root.toml`, parsed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootData {
    /// Utilities, looked up in [`JOB_PATH_DIRS`].
    #[serde(default)]
    pub utility: Vec<NamedEntry>,
    /// Libraries programs load with `dlopen`.
    #[serde(default)]
    pub library: Vec<NamedEntry>,
    /// Data files and directories.
    #[serde(default)]
    pub data: Vec<DataEntry>,
    /// Programs that may never be in the root.
    pub never: Vec<String>,
}

impl RootData {
    /// The built-in list, checked: every entry has a reason, no utility is on `never`.
    pub fn builtin() -> Result<Self, String> {
        let data: RootData =
            toml::from_str(MINIMAL_ROOT_TOML).map_err(|e| format!("minimal_root.toml: {e}"))?;
        for u in &data.utility {
            if u.reason.trim().is_empty() || u.name.contains('/') || u.name.is_empty() {
                return Err(format!(
                    "utility {:?} needs a plain name and a reason",
                    u.name
                ));
            }
            if data.never.contains(&u.name) {
                return Err(format!("utility {:?} is on the never list", u.name));
            }
        }
        for l in &data.library {
            if l.reason.trim().is_empty() {
                return Err(format!("library {:?} needs a reason", l.name));
            }
        }
        for d in &data.data {
            if d.reason.trim().is_empty() || !d.path.is_absolute() {
                return Err(format!(
                    "data {} needs an absolute path and a reason",
                    d.path.display()
                ));
            }
        }
        Ok(data)
    }
}

/// What a policy asks the minimal root to hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MinimalRootSpec {
    /// The languages' programs (first word of each command), sorted, without repeats.
    pub programs: Vec<String>,
    /// `[filesystem] site_packages`.
    pub site_packages: Vec<PathBuf>,
}

impl MinimalRootSpec {
    /// The spec of `policy`.
    pub fn from_policy(policy: &Policy) -> Self {
        let programs: BTreeSet<String> = policy
            .languages
            .values()
            .filter_map(|spec| spec.command.first().cloned())
            .collect();
        Self {
            programs: programs.into_iter().collect(),
            site_packages: policy.filesystem.site_packages.clone(),
        }
    }

    /// Names the copies of this spec: the same spec and list share one.
    fn key(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(FORMAT_VERSION.to_le_bytes());
        for p in &self.programs {
            hash.update(p.as_bytes());
            hash.update([0]);
        }
        hash.update([1]);
        for p in &self.site_packages {
            hash.update(p.as_os_str().as_encoded_bytes());
            hash.update([0]);
        }
        hash.update(MINIMAL_ROOT_TOML.as_bytes());
        hex::encode(&hash.finalize()[..8])
    }
}

/// airlock's cache directory, which the prepared roots live in: `$AIRLOCK_CACHE_DIR`, else
/// `/var/cache/airlock` for root, else `$XDG_CACHE_HOME/airlock`, else `~/.cache/airlock`.
/// A cache, not state: it is derived from the host and may be deleted at any time (not
/// while jobs run). Deliberately not the state directory, which tests and the cgroup v2
/// VM set per run: every run would copy the interpreters again.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AIRLOCK_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/cache/airlock");
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("airlock");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache/airlock"),
        None => std::env::temp_dir().join(format!(
            "airlock-cache-{}",
            rustix::process::geteuid().as_raw()
        )),
    }
}

/// The identity of a host file the copy was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceId {
    /// Host path.
    pub path: PathBuf,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl SourceId {
    fn of(path: &Path) -> io::Result<Self> {
        let meta = fs::symlink_metadata(path)?;
        Ok(Self {
            path: path.to_owned(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        })
    }

    fn still_holds(&self) -> bool {
        Self::of(&self.path).is_ok_and(|now| now == *self)
    }
}

/// How a language's program came out of the preparation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProgramState {
    /// In the root, at this path.
    Found {
        /// Where the job's `PATH` finds it.
        path: PathBuf,
    },
    /// The host has no such program in the job's `PATH`.
    Missing,
    /// The host's program cannot run: a library or its loader is missing.
    Broken {
        /// What is missing.
        reason: String,
    },
}

/// What a prepared root holds and came from (`manifest.json` beside the tree).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// Each language program's state.
    pub programs: BTreeMap<String, ProgramState>,
    /// Utilities of the list the host lacks.
    pub missing_utilities: Vec<String>,
    /// Files copied.
    pub files: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Host files and directories whose identity the copy depends on.
    pub sources: Vec<SourceId>,
}

impl Manifest {
    /// Whether every source still has the identity it had when the copy was made.
    pub fn is_fresh(&self) -> bool {
        self.format == FORMAT_VERSION && self.sources.iter().all(SourceId::still_holds)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir,
    File,
    Symlink(PathBuf),
}

/// The result of walking the host: what to copy, before anything is copied.
#[derive(Debug, Default)]
pub struct Collected {
    entries: BTreeMap<PathBuf, Entry>,
    watched: BTreeMap<PathBuf, SourceId>,
    elf_done: BTreeSet<PathBuf>,
    elf_queue: Vec<PathBuf>,
    /// ELF object → libraries it needs that the loader would not find.
    unresolved: BTreeMap<PathBuf, Vec<String>>,
    /// ELF object → the objects it loads (canonical paths).
    loads: BTreeMap<PathBuf, Vec<PathBuf>>,
    template: Option<elf::ElfDeps>,
    cache: LdCache,
    bytes: u64,
    /// Each program's state.
    pub programs: BTreeMap<String, ProgramState>,
    /// Listed utilities the host lacks.
    pub missing_utilities: Vec<String>,
    /// Each Python's standard library directory (`PREFIX/lib/python3.N`).
    python_stdlibs: Vec<PathBuf>,
    /// The policy's `site_packages`, which each Python is told about by a `.pth` file.
    site_packages: Vec<PathBuf>,
}

fn relative(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

impl Collected {
    fn too_big(&self) -> bool {
        self.entries.len() > MINIMAL_ROOT_MAX_FILES || self.bytes > MINIMAL_ROOT_MAX_BYTES
    }

    fn watch(&mut self, path: &Path) {
        if !self.watched.contains_key(path)
            && let Ok(id) = SourceId::of(path)
        {
            self.watched.insert(path.to_owned(), id);
        }
    }

    fn record(&mut self, path: &Path, entry: Entry) {
        if let Some(parent) = path.parent() {
            self.watch(parent);
        }
        self.entries.entry(path.to_owned()).or_insert(entry);
    }

    /// Resolves `path` component by component like the kernel does, recording every
    /// symbolic link on the way (so the copy has the same links), and returns the
    /// canonical path; `None` when it does not exist.
    fn follow(&mut self, path: &Path) -> io::Result<Option<PathBuf>> {
        let mut rest: Vec<std::ffi::OsString> = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(n) => rest.push(n.to_owned()),
                Component::ParentDir => rest.push("..".into()),
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        rest.reverse();
        let mut cur = PathBuf::from("/");
        let mut hops = 0;
        while let Some(name) = rest.pop() {
            if name == ".." {
                cur.pop();
                continue;
            }
            let next = cur.join(&name);
            let meta = match fs::symlink_metadata(&next) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(e),
            };
            if meta.file_type().is_symlink() {
                hops += 1;
                if hops > SYMLINK_HOPS_MAX {
                    return Err(io::Error::other(format!(
                        "{}: too many symbolic links",
                        path.display()
                    )));
                }
                let target = fs::read_link(&next)?;
                self.record(&next, Entry::Symlink(target.clone()));
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => rest.push(n.to_owned()),
                        Component::ParentDir => rest.push("..".into()),
                        Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                    }
                }
            } else if !rest.is_empty() && !meta.is_dir() {
                return Ok(None);
            } else {
                cur = next;
            }
        }
        Ok(Some(cur))
    }

    /// Adds `path` (a file or a whole directory) with the links leading to it; returns the
    /// canonical path of what was added.
    fn add(&mut self, path: &Path) -> io::Result<Option<PathBuf>> {
        let Some(real) = self.follow(path)? else {
            return Ok(None);
        };
        let meta = fs::symlink_metadata(&real)?;
        if meta.is_dir() {
            self.add_tree(&real)?;
        } else if meta.is_file() {
            self.add_file(&real, &meta);
        }
        Ok(Some(real))
    }

    fn add_file(&mut self, real: &Path, meta: &fs::Metadata) {
        if self.entries.contains_key(real) {
            return;
        }
        self.bytes += meta.size();
        self.record(real, Entry::File);
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let maybe_elf = meta.mode() & 0o111 != 0 || name.ends_with(".so") || name.contains(".so.");
        if maybe_elf && elf::is_elf(real) {
            self.watch(real);
            self.elf_queue.push(real.to_owned());
        }
    }

    fn add_tree(&mut self, dir: &Path) -> io::Result<()> {
        let mut stack = vec![dir.to_owned()];
        while let Some(dir) = stack.pop() {
            if self.too_big() {
                return Err(io::Error::other(format!(
                    "more than {MINIMAL_ROOT_MAX_FILES} files or {} GiB",
                    MINIMAL_ROOT_MAX_BYTES >> 30
                )));
            }
            self.record(&dir, Entry::Dir);
            self.watch(&dir);
            let mut names: Vec<PathBuf> = fs::read_dir(&dir)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .collect();
            names.sort();
            for path in names {
                let Ok(meta) = fs::symlink_metadata(&path) else {
                    continue;
                };
                if meta.file_type().is_symlink() {
                    // The link, and the file it names when that is a file (a directory
                    // elsewhere is not pulled in: the link then dangles, as a narrower
                    // view should).
                    if fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                        self.add(&path)?;
                    } else if let Ok(target) = fs::read_link(&path) {
                        self.record(&path, Entry::Symlink(target));
                    }
                } else if meta.is_dir() {
                    stack.push(path);
                } else if meta.is_file() {
                    self.add_file(&path, &meta);
                }
            }
        }
        Ok(())
    }

    /// Adds the libraries and loaders of every queued ELF object, transitively.
    fn close_libraries(&mut self) -> io::Result<()> {
        while let Some(object) = self.elf_queue.pop() {
            if !self.elf_done.insert(object.clone()) {
                continue;
            }
            let Ok(deps) = elf::read_deps(&object) else {
                continue;
            };
            if self.template.is_none() && deps.interpreter.is_some() {
                self.template = Some(deps.clone());
            }
            let mut loads = Vec::new();
            if let Some(interp) = &deps.interpreter {
                match self.add(Path::new(interp))? {
                    Some(real) => loads.push(real),
                    None => self
                        .unresolved
                        .entry(object.clone())
                        .or_default()
                        .push(interp.clone()),
                }
            }
            for name in &deps.needed {
                let found = elf::resolve_library(name, &object, &deps, &self.cache);
                match found {
                    Some(path) => {
                        if let Some(real) = self.add(&path)? {
                            loads.push(real);
                        }
                    }
                    None => self
                        .unresolved
                        .entry(object.clone())
                        .or_default()
                        .push(name.clone()),
                }
            }
            self.loads.insert(object, loads);
        }
        Ok(())
    }

    /// What the loader would miss starting `object`: its own and its libraries' missing
    /// libraries.
    fn missing_for(&self, object: &Path) -> Vec<String> {
        let mut missing = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut stack = vec![object.to_owned()];
        while let Some(o) = stack.pop() {
            if !seen.insert(o.clone()) {
                continue;
            }
            if let Some(names) = self.unresolved.get(&o) {
                missing.extend(names.iter().cloned());
            }
            if let Some(next) = self.loads.get(&o) {
                stack.extend(next.iter().cloned());
            }
        }
        missing.into_iter().collect()
    }
}

/// Finds `name` like the job's `PATH` would; the path found (not resolved).
fn find_program(name: &str) -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = if name.contains('/') {
        vec![PathBuf::from(name)]
    } else {
        JOB_PATH_DIRS
            .iter()
            .map(|d| Path::new(d).join(name))
            .collect()
    };
    candidates
        .into_iter()
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// The interpreter a `#!` script names, when `path` is one.
fn shebang_interpreter(path: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = {
        use std::io::Read;
        fs::File::open(path).ok()?.read(&mut head).ok()?
    };
    let text = head[..n].strip_prefix(b"#!")?;
    let line = text.split(|b| *b == b'\n').next()?;
    let line = String::from_utf8_lossy(line);
    let word = line.split_whitespace().next()?;
    Some(PathBuf::from(word))
}

/// A Python's standard library directories, from the real name of its binary
/// (`python3.11` in `PREFIX/bin` has `PREFIX/lib/python3.11`, landmark `os.py`).
fn python_stdlib(real: &Path) -> Vec<PathBuf> {
    let Some(name) = real.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    if !name.starts_with("python") {
        return Vec::new();
    }
    let Some(prefix) = real.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let version = name.trim_start_matches("python");
    let lib = prefix.join("lib");
    let mut dirs = Vec::new();
    if version.contains('.') {
        dirs.push(lib.join(name));
    } else if let Ok(read) = fs::read_dir(&lib) {
        // `python3` itself a file: any `python3.N` beside it.
        let mut found: Vec<PathBuf> = read
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("python{version}.")))
            })
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs.retain(|d| d.join("os.py").is_file());
    dirs
}

/// Walks the host for `spec`: what the root would hold. Reads only; copies nothing.
pub fn collect(spec: &MinimalRootSpec, data: &RootData) -> io::Result<Collected> {
    let mut c = Collected {
        cache: LdCache::read(Path::new("/etc/ld.so.cache")),
        ..Collected::default()
    };
    c.watch(Path::new("/etc/ld.so.cache"));
    for dir in JOB_PATH_DIRS {
        c.watch(Path::new(dir));
    }
    // A merged-/usr host's top-level links (/bin -> usr/bin, ...), so `#!/bin/sh` and
    // `/lib64/ld-linux-*.so.2` name what they name on the host.
    for name in mount_plan::HOST_SYSTEM_DIRS {
        let path = Path::new("/").join(name);
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            c.follow(&path)?;
        }
    }
    let mut primaries = Vec::new();
    for program in &spec.programs {
        let Some(found) = find_program(program) else {
            c.programs.insert(program.clone(), ProgramState::Missing);
            continue;
        };
        let Some(real) = c.add(&found)? else {
            c.programs.insert(program.clone(), ProgramState::Missing);
            continue;
        };
        if !elf::is_elf(&real)
            && let Some(interp) = shebang_interpreter(&real)
        {
            c.add(&interp)?;
        }
        for stdlib in python_stdlib(&real) {
            c.add(&stdlib)?;
            if !c.python_stdlibs.contains(&stdlib) {
                c.python_stdlibs.push(stdlib);
            }
        }
        primaries.push((program.clone(), found, real));
    }
    c.site_packages = spec.site_packages.clone();
    for dir in &spec.site_packages {
        if c.add(dir)?.is_none() {
            tracing::warn!(dir = %dir.display(), "a site_packages directory of the policy does not exist");
        }
    }
    for utility in &data.utility {
        if data.never.contains(&utility.name) {
            continue;
        }
        match find_program(&utility.name) {
            Some(found) => {
                let real = c.add(&found)?;
                if let Some(real) = real
                    && !elf::is_elf(&real)
                    && let Some(interp) = shebang_interpreter(&real)
                {
                    c.add(&interp)?;
                }
            }
            None => c.missing_utilities.push(utility.name.clone()),
        }
    }
    for entry in &data.data {
        c.add(&entry.path)?;
    }
    c.close_libraries()?;
    if let Some(template) = c.template.clone() {
        for library in &data.library {
            if let Some(path) =
                elf::resolve_library(&library.name, Path::new("/"), &template, &c.cache)
            {
                c.add(&path)?;
            }
        }
        c.close_libraries()?;
    }
    for (program, found, real) in primaries {
        let state = if elf::is_elf(&real) && elf::read_deps(&real).is_err() {
            ProgramState::Broken {
                reason: format!("{} is not a readable ELF program", real.display()),
            }
        } else {
            let missing = c.missing_for(&real);
            if missing.is_empty() {
                ProgramState::Found { path: found }
            } else {
                ProgramState::Broken {
                    reason: format!(
                        "{} needs {} and the host's loader would not find {}",
                        real.display(),
                        missing.join(", "),
                        if missing.len() == 1 { "it" } else { "them" }
                    ),
                }
            }
        };
        c.programs.insert(program, state);
    }
    if c.too_big() {
        return Err(io::Error::other(format!(
            "more than {MINIMAL_ROOT_MAX_FILES} files or {} GiB",
            MINIMAL_ROOT_MAX_BYTES >> 30
        )));
    }
    Ok(c)
}

impl Collected {
    /// Whether the root would hold `path` (a host path).
    pub fn holds(&self, path: &Path) -> bool {
        self.entries.contains_key(path)
    }

    /// Host paths of everything the root would hold.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.entries.keys().map(PathBuf::as_path)
    }
}

/// A prepared root, ready to be mounted.
#[derive(Debug, Clone)]
pub struct PreparedRoot {
    /// The tree (`/` of the job).
    pub tree: PathBuf,
    /// An empty directory, the overlay's second layer (overlayfs wants two without an
    /// upper layer).
    pub spare: PathBuf,
    /// What it holds.
    pub manifest: Manifest,
}

fn io_err(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> NativeError + use<> {
    let path = path.to_owned();
    move |source| NativeError::MinimalRoot { step, path, source }
}

/// Creates `dir` and its missing parents as 0755 (readable by the sandbox's ids, which are
/// not airlock's own in the root mode), whatever the umask.
fn make_dirs(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = dir;
    while fs::symlink_metadata(cur).is_err() {
        missing.push(cur.to_owned());
        match cur.parent() {
            Some(p) => cur = p,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(&d) {
            Ok(()) => fs::set_permissions(&d, fs::Permissions::from_mode(0o755))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Refuses a directory another user could change: whoever may write to it decides what
/// every job's interpreter is.
fn check_private(dir: &Path) -> Result<(), NativeError> {
    let meta = fs::symlink_metadata(dir).map_err(io_err("stat", dir))?;
    let euid = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(NativeError::MinimalRoot {
            step: "check",
            path: dir.to_owned(),
            source: io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "must be a directory owned by uid {euid} and writable by no one else \
                     (set AIRLOCK_CACHE_DIR to such a directory)"
                ),
            ),
        });
    }
    Ok(())
}

/// Copies what `c` collected into `root` (which must not exist) and writes `/etc`.
fn build_tree(c: &Collected, root: &Path) -> io::Result<(u64, u64)> {
    make_dirs(root)?;
    let (mut files, mut bytes) = (0u64, 0u64);
    for (path, entry) in &c.entries {
        let dst = root.join(relative(path));
        if let Some(parent) = dst.parent() {
            make_dirs(parent)?;
        }
        match entry {
            Entry::Dir => make_dirs(&dst)?,
            Entry::Symlink(target) => {
                if fs::symlink_metadata(&dst).is_err() {
                    std::os::unix::fs::symlink(target, &dst)?;
                }
            }
            Entry::File => {
                let meta = fs::metadata(path)?;
                fs::copy(path, &dst)?;
                // Never a set-id bit; the host's read and execute bits as they are.
                fs::set_permissions(&dst, fs::Permissions::from_mode(meta.mode() & 0o777))?;
                // Python trusts its .pyc files only while the source's mtime matches.
                let times = fs::FileTimes::new()
                    .set_modified(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH))
                    .set_accessed(meta.accessed().unwrap_or(SystemTime::UNIX_EPOCH));
                fs::File::options()
                    .write(true)
                    .open(&dst)
                    .and_then(|f| f.set_times(times))?;
                files += 1;
                bytes += meta.size();
            }
        }
    }
    let etc = root.join("etc");
    make_dirs(&etc)?;
    for (name, content) in mount_plan::synthesized_etc() {
        let path = etc.join(name);
        let _ = fs::remove_file(&path);
        fs::write(&path, content)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
    }
    let mtab = etc.join("mtab");
    let _ = fs::remove_file(&mtab);
    std::os::unix::fs::symlink("../proc/self/mounts", &mtab)?;
    write_site_packages_pth(c, root)?;
    Ok((files, bytes))
}

/// The name of the `.pth` file that puts the policy's `site_packages` on each Python's
/// `sys.path`.
pub const SITE_PACKAGES_PTH: &str = "airlock-site-packages.pth";

/// Puts the policy's `site_packages` on every copied Python's path: a `.pth` file in each
/// directory its `site` module reads them from, upstream's and Debian's layouts both (a
/// directory the interpreter does not read costs nothing). Unlike `PYTHONPATH` this holds
/// under `python3 -I`, which the built-in policy runs, and the job's environment stays
/// as it is.
fn write_site_packages_pth(c: &Collected, root: &Path) -> io::Result<()> {
    if c.site_packages.is_empty() {
        return Ok(());
    }
    let mut content = String::new();
    for dir in &c.site_packages {
        // The policy refuses names with control characters: one line per directory.
        content.push_str(&dir.to_string_lossy());
        content.push('\n');
    }
    for stdlib in &c.python_stdlibs {
        let (Some(version), Some(prefix)) = (
            stdlib.file_name().and_then(|n| n.to_str()),
            stdlib.parent().and_then(Path::parent),
        ) else {
            continue;
        };
        let site_dirs = [
            stdlib.join("site-packages"),
            stdlib.join("dist-packages"),
            prefix.join("local/lib").join(version).join("dist-packages"),
            prefix.join("lib/python3/dist-packages"),
        ];
        for dir in site_dirs {
            let dst = root.join(relative(&dir));
            make_dirs(&dst)?;
            let path = dst.join(SITE_PACKAGES_PTH);
            fs::write(&path, &content)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// The directory of one spec's copies: `current` (a link to the copy in use), `lock`,
/// and `copy-<hash>/{root,empty,manifest.json}`.
fn spec_dir(cache: &Path, spec: &MinimalRootSpec) -> PathBuf {
    cache.join("roots").join(format!("minimal-{}", spec.key()))
}

fn load_copy(copy: &Path) -> Option<PreparedRoot> {
    let manifest: Manifest =
        serde_json::from_slice(&fs::read(copy.join("manifest.json")).ok()?).ok()?;
    Some(PreparedRoot {
        tree: copy.join("root"),
        spare: copy.join("empty"),
        manifest,
    })
}

fn current_copy(dir: &Path) -> Option<PreparedRoot> {
    let name = fs::read_link(dir.join("current")).ok()?;
    let prepared = load_copy(&dir.join(name))?;
    prepared.manifest.is_fresh().then_some(prepared)
}

/// Returns the prepared root for `spec`, preparing it first when there is none or the
/// host changed since. Safe against other airlocks doing the same at once.
pub fn prepare(cache: &Path, spec: &MinimalRootSpec) -> Result<PreparedRoot, NativeError> {
    let dir = spec_dir(cache, spec);
    if let Some(prepared) = current_copy(&dir) {
        return Ok(prepared);
    }
    make_dirs(&dir).map_err(io_err("create", &dir))?;
    check_private(&cache.join("roots"))?;
    check_private(&dir)?;
    let lock_path = dir.join("lock");
    let lock = fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open lock", &lock_path))?;
    use rustix::fs::{FlockOperation, flock};
    if flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
        tracing::warn!(dir = %dir.display(), "another airlock is preparing the minimal root; waiting for it");
        flock(&lock, FlockOperation::LockExclusive)
            .map_err(|e| io_err("lock", &lock_path)(e.into()))?;
    }
    // Made by the one that held the lock before us?
    if let Some(prepared) = current_copy(&dir) {
        return Ok(prepared);
    }
    let started = Instant::now();
    tracing::warn!(
        programs = %spec.programs.join(", "),
        dir = %dir.display(),
        "preparing the minimal host root (first use, or the host's files changed); this takes a few seconds"
    );
    let data = RootData::builtin().map_err(|reason| NativeError::MinimalRoot {
        step: "read policy/minimal_root.toml",
        path: PathBuf::from("policy/minimal_root.toml"),
        source: io::Error::other(reason),
    })?;
    let collected = collect(spec, &data).map_err(io_err("walk the host for", Path::new("/")))?;
    let sources: Vec<SourceId> = collected.watched.values().cloned().collect();
    // Named by what it holds, not by the identity of the directories walked: a host whose
    // `/etc` or `/usr/lib` changed time (a `useradd`, DHCP rewriting resolv.conf) but not
    // one file the copy takes keeps its copy, with the new identities to check against.
    let name = format!(
        "copy-{}",
        content_key(&collected).map_err(io_err("walk the host for", Path::new("/")))?
    );
    let copy = dir.join(&name);
    if let Some(existing) = load_copy(&copy) {
        if existing.manifest.sources != sources {
            let manifest = Manifest {
                sources: sources.clone(),
                ..existing.manifest
            };
            write_manifest(&copy, &manifest)?;
            tracing::info!(copy = %copy.display(),
                "the host's directories changed but not the files the minimal root holds; copy kept");
        }
    } else {
        let _ = fs::remove_dir_all(&copy);
        let tmp = dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let built = build_copy(&collected, sources, &tmp);
        if let Err(e) = built {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &copy).map_err(io_err("rename into place", &copy))?;
    }
    let link_tmp = dir.join(format!(".current-{}", std::process::id()));
    let _ = fs::remove_file(&link_tmp);
    std::os::unix::fs::symlink(&name, &link_tmp).map_err(io_err("link", &link_tmp))?;
    fs::rename(&link_tmp, dir.join("current")).map_err(io_err("link", &dir))?;
    remove_old_copies(&dir, &name);
    let prepared = load_copy(&copy).ok_or_else(|| NativeError::MinimalRoot {
        step: "read back",
        path: copy.clone(),
        source: io::Error::other("the manifest just written does not parse"),
    })?;
    for (program, state) in &prepared.manifest.programs {
        match state {
            ProgramState::Found { .. } => {}
            ProgramState::Missing => {
                tracing::warn!(%program, "not installed on this host: its language's jobs will be refused")
            }
            ProgramState::Broken { reason } => {
                tracing::warn!(%program, %reason, "broken on this host: its language's jobs will be refused")
            }
        }
    }
    tracing::warn!(
        files = prepared.manifest.files,
        mib = prepared.manifest.bytes >> 20,
        secs = format!("{:.1}", started.elapsed().as_secs_f64()),
        "minimal host root prepared"
    );
    Ok(prepared)
}

fn build_copy(c: &Collected, sources: Vec<SourceId>, tmp: &Path) -> Result<(), NativeError> {
    make_dirs(tmp).map_err(io_err("create", tmp))?;
    let root = tmp.join("root");
    let (files, bytes) = build_tree(c, &root).map_err(io_err("copy into", &root))?;
    make_dirs(&tmp.join("empty")).map_err(io_err("create", tmp))?;
    let manifest = Manifest {
        format: FORMAT_VERSION,
        programs: c.programs.clone(),
        missing_utilities: c.missing_utilities.clone(),
        files,
        bytes,
        sources,
    };
    write_manifest(tmp, &manifest)
}

/// Writes `copy`'s manifest whole (under a temporary name, renamed into place): a reader
/// never sees half of one.
fn write_manifest(copy: &Path, manifest: &Manifest) -> Result<(), NativeError> {
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|e| io_err("write manifest of", copy)(io::Error::other(e)))?;
    let tmp = copy.join(".manifest.json.tmp");
    fs::write(&tmp, text).map_err(io_err("write manifest of", copy))?;
    fs::rename(&tmp, copy.join("manifest.json")).map_err(io_err("write manifest of", copy))
}

/// What a copy made from `c` holds, as a key: every entry's path and kind, a link's target,
/// a file's identity on the host (inode, size, modification time), the synthesized `/etc`
/// and [`FORMAT_VERSION`]; not the directories' times. A stat per file: a few milliseconds
/// for a Python's standard library, paid only when a watched directory changed.
fn content_key(c: &Collected) -> io::Result<String> {
    let mut hash = Sha256::new();
    hash.update(FORMAT_VERSION.to_le_bytes());
    for (path, entry) in &c.entries {
        hash.update(path.as_os_str().as_encoded_bytes());
        match entry {
            Entry::Dir => hash.update(b"\0d"),
            Entry::Symlink(target) => {
                hash.update(b"\0l");
                hash.update(target.as_os_str().as_encoded_bytes());
            }
            Entry::File => {
                let id = SourceId::of(path)?;
                hash.update(b"\0f");
                hash.update(id.ino.to_le_bytes());
                hash.update(id.size.to_le_bytes());
                hash.update(id.mtime_ns.to_le_bytes());
            }
        }
        hash.update(b"\n");
    }
    for (name, content) in mount_plan::synthesized_etc() {
        hash.update(name.as_bytes());
        hash.update(b"\0");
        hash.update(content.as_bytes());
    }
    Ok(hex::encode(&hash.finalize()[..8]))
}

/// Removes the copies other than `keep` that no sandbox has mounted, now that `keep` is
/// ready, and the temporary directories of preparations that died (called under the
/// preparation lock, so none is under way). A copy some sandbox still mounts (a running
/// job, a waiting warm sandbox, a zygote) stays until none does, and at most
/// [`OLD_COPY_MAX_AGE`]. So the cache holds one copy per root shape, plus those in use.
fn remove_old_copies(dir: &Path, keep: &str) {
    let Ok(read) = fs::read_dir(dir) else { return };
    let mut in_use: Option<BTreeSet<PathBuf>> = None;
    for entry in read.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == keep {
            continue;
        }
        if name.starts_with(".tmp-") {
            let _ = fs::remove_dir_all(entry.path());
            continue;
        }
        if !name.starts_with("copy-") {
            continue;
        }
        let too_old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > OLD_COPY_MAX_AGE);
        let path = entry.path();
        let mounted = in_use
            .get_or_insert_with(|| mounted_copies(dir))
            .contains(&path);
        if too_old || !mounted {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// The prepared copies some process's mount table has an overlay layer of: every
/// sandbox's mount namespace is some process's, so a copy a job, a warm sandbox or a
/// zygote uses is listed here while it does. The sandbox init names a copy's layers
/// relative to its directory of copies (`copy-<key>/empty`, so that no host path shows
/// in a job's mount table): a relative layer is taken to be one of `dir`'s. One of
/// another directory of copies with the same name only keeps `dir`'s copy a while longer.
fn mounted_copies(dir: &Path) -> BTreeSet<PathBuf> {
    let mut copies = BTreeSet::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return copies;
    };
    let mut seen_namespaces = BTreeSet::new();
    for entry in procs.filter_map(Result::ok) {
        let pid = entry.file_name();
        if !pid.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let proc_dir = entry.path();
        // One read per mount namespace, however many processes share it.
        if let Ok(ns) = fs::read_link(proc_dir.join("ns/mnt"))
            && !seen_namespaces.insert(ns)
        {
            continue;
        }
        let Ok(table) = fs::read_to_string(proc_dir.join("mountinfo")) else {
            continue;
        };
        for line in table.lines().filter(|l| l.contains(" - overlay ")) {
            for option in line.rsplit(' ').next().unwrap_or_default().split(',') {
                let Some(layers) = option.strip_prefix("lowerdir=") else {
                    continue;
                };
                for layer in layers.split(':') {
                    // `copy-<key>/root/<entry>` or `copy-<key>/empty` (older inits named them
                    // absolutely): the copy is the spare's parent.
                    let layer = dir.join(unescape_mountinfo(layer));
                    if let Some(copy) = layer.parent() {
                        copies.insert(copy.to_owned());
                    }
                }
            }
        }
    }
    copies
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Bytes and copies of the prepared roots under `cache` (`airlock doctor`, `/metrics`).
pub fn cache_usage(cache: &Path) -> (u64, u64) {
    fn bytes_below(path: &Path, depth: usize) -> u64 {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return 0;
        };
        if !meta.is_dir() || depth > 64 {
            return meta.size();
        }
        fs::read_dir(path).map_or(0, |read| {
            read.filter_map(Result::ok)
                .map(|e| bytes_below(&e.path(), depth + 1))
                .sum()
        })
    }
    let roots = cache.join("roots");
    let mut copies = 0;
    let mut bytes = 0;
    for shape in fs::read_dir(&roots)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        for copy in fs::read_dir(shape.path())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            if copy.file_name().to_string_lossy().starts_with("copy-") {
                copies += 1;
                bytes += bytes_below(&copy.path(), 0);
            }
        }
    }
    (bytes, copies)
}

/// Whether this kernel offers overlayfs, which both host root kinds mount per job (their
/// inodes the job's own): `/proc/filesystems` lists `overlay` once the module is loaded.
/// Read once per process; a host that loads the module later needs a restart of airlock.
pub fn overlayfs_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        fs::read_to_string("/proc/filesystems").is_ok_and(|list| {
            list.lines()
                .any(|line| line.split_whitespace().last() == Some("overlay"))
        })
    })
}

/// Refuses a host root on a kernel without overlayfs, saying what to do.
pub fn require_overlayfs() -> Result<(), NativeError> {
    if overlayfs_available() {
        return Ok(());
    }
    Err(NativeError::Unsupported {
        control: "overlayfs",
        reason: "this kernel lists no overlay filesystem in /proc/filesystems; rootfs = \
                 \"host\" and \"host-full\" mount one per job so that its inodes are the \
                 job's own, never the host's (load it as root: modprobe overlay), or use \
                 rootfs = \"dir:...\" or \"image:...\""
            .to_owned(),
    })
}

/// The empty directory that is the second layer of the overlays of a `host-full` root.
pub fn spare_dir(cache: &Path) -> Result<PathBuf, NativeError> {
    let dir = cache.join("roots").join("empty");
    make_dirs(&dir).map_err(io_err("create", &dir))?;
    let empty = fs::read_dir(&dir)
        .map_err(io_err("read", &dir))?
        .next()
        .is_none();
    if !empty {
        return Err(NativeError::MinimalRoot {
            step: "check",
            path: dir,
            source: io::Error::other("must be empty: it is a layer of every host-full job's root"),
        });
    }
    Ok(dir)
}

/// A backend's minimal root: prepared on first use, checked against the host again at most
/// every [`RECHECK_INTERVAL`].
#[derive(Debug)]
pub struct MinimalRoot {
    spec: MinimalRootSpec,
    cache: PathBuf,
    state: Mutex<Option<(Arc<PreparedRoot>, Instant)>>,
}

impl MinimalRoot {
    /// A root for `spec` in `cache`; nothing is read or copied yet.
    pub fn new(spec: MinimalRootSpec, cache: PathBuf) -> Self {
        Self {
            spec,
            cache,
            state: Mutex::new(None),
        }
    }

    /// The prepared root, made or remade now if needed.
    pub fn get(&self) -> Result<Arc<PreparedRoot>, NativeError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| NativeError::Helper("minimal root state poisoned".into()))?;
        if let Some((prepared, checked)) = state.as_mut() {
            if checked.elapsed() < RECHECK_INTERVAL {
                return Ok(prepared.clone());
            }
            if prepared.manifest.is_fresh() {
                *checked = Instant::now();
                return Ok(prepared.clone());
            }
        }
        let prepared = Arc::new(prepare(&self.cache, &self.spec)?);
        *state = Some((prepared.clone(), Instant::now()));
        Ok(prepared)
    }

    /// The cache directory.
    pub fn cache(&self) -> &Path {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_parses_and_no_utility_is_forbidden() {
        let data = RootData::builtin().unwrap();
        assert!(data.utility.iter().any(|u| u.name == "env"));
        for forbidden in [
            "gcc", "g++", "ssh", "scp", "curl", "wget", "git", "gcloud", "kubectl", "docker",
            "podman", "runc", "crun", "nsenter", "su", "apt-get", "strace", "gdb",
        ] {
            assert!(data.never.iter().any(|n| n == forbidden), "{forbidden}");
        }
    }

    #[test]
    fn the_shell_comes_with_its_loader_and_libc_and_nothing_forbidden() {
        let spec = MinimalRootSpec {
            programs: vec!["sh".into()],
            site_packages: Vec::new(),
        };
        let data = RootData::builtin().unwrap();
        let c = collect(&spec, &data).unwrap();
        assert!(
            matches!(c.programs["sh"], ProgramState::Found { .. }),
            "{:?}",
            c.programs
        );
        assert!(
            c.paths().any(|p| p.to_string_lossy().contains("libc.so")),
            "no libc"
        );
        for p in c.paths() {
            let name = p.file_name().unwrap().to_string_lossy();
            assert!(
                !data.never.iter().any(|n| *n == name),
                "{} is in the root",
                p.display()
            );
        }
    }

    #[test]
    fn a_cache_others_may_write_to_is_refused() {
        let cache = tempfile::tempdir().unwrap();
        let roots = cache.path().join("roots");
        fs::create_dir(&roots).unwrap();
        fs::set_permissions(&roots, fs::Permissions::from_mode(0o777)).unwrap();
        let spec = MinimalRootSpec {
            programs: vec!["sh".into()],
            site_packages: Vec::new(),
        };
        let err = prepare(cache.path(), &spec).unwrap_err().to_string();
        assert!(err.contains("roots"), "{err}");
    }

    #[test]
    fn a_missing_program_is_reported_not_fatal() {
        let spec = MinimalRootSpec {
            programs: vec!["airlock-no-such-interpreter".into()],
            site_packages: Vec::new(),
        };
        let c = collect(&spec, &RootData::builtin().unwrap()).unwrap();
        assert_eq!(
            c.programs["airlock-no-such-interpreter"],
            ProgramState::Missing
        );
    }

    fn copies_in(cache: &Path) -> Vec<String> {
        let mut names = Vec::new();
        for shape in fs::read_dir(cache.join("roots"))
            .unwrap()
            .filter_map(Result::ok)
        {
            if !shape.file_name().to_string_lossy().starts_with("minimal-") {
                continue;
            }
            for copy in fs::read_dir(shape.path()).unwrap().filter_map(Result::ok) {
                let name = copy.file_name().to_string_lossy().into_owned();
                if name.starts_with("copy-") || name.starts_with(".tmp-") {
                    names.push(name);
                }
            }
        }
        names.sort();
        names
    }

    /// A host whose watched directory changed time but none of the files the copy takes
    /// (what `useradd` or DHCP do to `/etc`) keeps its copy; a changed file makes a new
    /// one, and the old one, mounted by no sandbox, is removed at once.
    #[test]
    fn a_directory_touched_keeps_the_copy_and_a_replaced_copy_is_removed() {
        let cache = tempfile::tempdir().unwrap();
        let site = tempfile::tempdir().unwrap();
        fs::write(site.path().join("mod.py"), "x = 1\n").unwrap();
        let spec = MinimalRootSpec {
            programs: vec!["sh".into()],
            site_packages: vec![site.path().to_owned()],
        };
        let first = prepare(cache.path(), &spec).unwrap();
        assert_eq!(copies_in(cache.path()).len(), 1);
        // The directory's time changes, its content does not.
        fs::write(site.path().join("scratch"), "").unwrap();
        fs::remove_file(site.path().join("scratch")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        fs::write(site.path().join("scratch2"), "").unwrap();
        fs::remove_file(site.path().join("scratch2")).unwrap();
        assert!(
            !first.manifest.is_fresh(),
            "the test did not change the directory"
        );
        let second = prepare(cache.path(), &spec).unwrap();
        assert_eq!(second.tree, first.tree);
        // The kept copy now carries the directory's new identity.
        let site_now = SourceId::of(site.path()).unwrap();
        assert!(second.manifest.sources.contains(&site_now));
        assert!(!first.manifest.sources.contains(&site_now));
        assert_eq!(
            copies_in(cache.path()).len(),
            1,
            "{:?}",
            copies_in(cache.path())
        );
        // A file the copy takes changes: a new copy, the old one gone.
        fs::write(site.path().join("new.py"), "y = 2\n").unwrap();
        let third = prepare(cache.path(), &spec).unwrap();
        assert_ne!(third.tree, first.tree);
        assert!(
            third
                .tree
                .join(relative(&site.path().join("new.py")))
                .exists()
        );
        assert!(!first.tree.exists());
        assert_eq!(
            copies_in(cache.path()).len(),
            1,
            "{:?}",
            copies_in(cache.path())
        );
    }

    /// A copy a sandbox still mounts (as an overlay's lower layer) stays when a newer one
    /// is ready, and goes once nothing mounts it.
    #[test]
    fn a_copy_still_mounted_is_kept_until_it_is_not() {
        if !rustix::process::geteuid().is_root() || !overlayfs_available() {
            eprintln!("skipped: mounting an overlay needs root and overlayfs");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for name in ["copy-old", "copy-new", "copy-unused"] {
            fs::create_dir_all(dir.path().join(name).join("root/usr")).unwrap();
            fs::create_dir_all(dir.path().join(name).join("empty")).unwrap();
        }
        fs::create_dir(dir.path().join(".tmp-1-2")).unwrap();
        let target = dir.path().join("mnt");
        fs::create_dir(&target).unwrap();
        // Named as the sandbox init names them: relative to the directory of copies, the
        // mount's working directory (mount(8) passes the options as they are).
        let mounted = std::process::Command::new("mount")
            .current_dir(dir.path())
            .args(["-t", "overlay", "airlock-test", "-o"])
            .arg("ro,lowerdir=copy-old/root/usr:copy-old/empty")
            .arg(&target)
            .status()
            .unwrap();
        assert!(mounted.success());
        remove_old_copies(dir.path(), "copy-new");
        let left = |d: &Path| {
            let mut names: Vec<String> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != "mnt")
                .collect();
            names.sort();
            names
        };
        assert_eq!(left(dir.path()), ["copy-new", "copy-old"]);
        rustix::mount::unmount(&target, rustix::mount::UnmountFlags::empty()).unwrap();
        remove_old_copies(dir.path(), "copy-new");
        assert_eq!(left(dir.path()), ["copy-new"]);
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/a\\040b/c"), "/a b/c");
        assert_eq!(unescape_mountinfo("/plain\\"), "/plain\\");
    }

    #[test]
    fn preparing_twice_reuses_the_copy_and_a_changed_source_makes_it_stale() {
        let cache = tempfile::tempdir().unwrap();
        let spec = MinimalRootSpec {
            programs: vec!["sh".into()],
            site_packages: Vec::new(),
        };
        let first = prepare(cache.path(), &spec).unwrap();
        assert!(first.tree.join("bin/sh").exists() || first.tree.join("usr/bin/sh").exists());
        assert!(
            fs::read_to_string(first.tree.join("etc/passwd"))
                .unwrap()
                .contains("nobody")
        );
        if fs::symlink_metadata("/bin").is_ok_and(|m| m.file_type().is_symlink()) {
            assert_eq!(
                fs::read_link(first.tree.join("bin")).unwrap(),
                fs::read_link("/bin").unwrap()
            );
        }
        let second = prepare(cache.path(), &spec).unwrap();
        assert_eq!(first.tree, second.tree);
        // A source whose identity no longer holds makes the copy stale.
        let mut manifest = first.manifest.clone();
        manifest.sources[0].mtime_ns += 1;
        assert!(!manifest.is_fresh());
        assert!(first.manifest.is_fresh());
    }
}
