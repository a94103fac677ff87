//! What the host can give the page cache: `MemAvailable`, and where the
//! process runs in a memory-limited cgroup (a container), the room the
//! cgroup has left. The page-cache default of a staging device is sized
//! against it ([`policy::page_cache_default`](crate::policy::page_cache_default)).
//!
//! Both figures count clean page cache as room, as the kernel does:
//! `MemAvailable` is free memory plus what reclaim can take back (the
//! model's own cached pages included, so they are not added a second
//! time), and a cgroup's room is its limit less its usage, with the file
//! pages charged to it added back (its usage counts them, reclaim frees
//! them first).

use std::path::{Path, PathBuf};

/// The host's memory figures the page-cache default is sized against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// `MemTotal` of `/proc/meminfo`, in bytes.
    pub total: u64,
    /// `MemAvailable` of `/proc/meminfo`, in bytes.
    pub available: u64,
    /// The tightest room a memory-limited cgroup of this process (or one
    /// above it) has left, in bytes; `None` where no limit is set.
    pub cgroup_room: Option<u64>,
}

/// Which figure bounds the room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoomSource {
    /// The host's `MemAvailable`.
    Host,
    /// A cgroup's limit.
    Cgroup,
}

impl HostMemory {
    /// This host's and this process's figures now (`/proc` and
    /// `/sys/fs/cgroup`); `None` where `/proc/meminfo` cannot be read.
    pub fn current() -> Option<HostMemory> {
        HostMemory::read(Path::new("/proc"), Path::new("/sys/fs/cgroup"))
    }

    /// The figures under `proc` (a `/proc`) and `cgroup_root` (a
    /// `/sys/fs/cgroup`): the tests give a folder of their own.
    pub fn read(proc: &Path, cgroup_root: &Path) -> Option<HostMemory> {
        let meminfo = std::fs::read_to_string(proc.join("meminfo")).ok()?;
        let total = meminfo_bytes(&meminfo, "MemTotal")?;
        let available = meminfo_bytes(&meminfo, "MemAvailable")?;
        let cgroup_room = std::fs::read_to_string(proc.join("self/cgroup"))
            .ok()
            .and_then(|own| cgroup_room(&own, cgroup_root));
        Some(HostMemory {
            total,
            available,
            cgroup_room,
        })
    }

    /// The bytes the page cache can have, and which figure bounds them.
    pub fn room(&self) -> (u64, RoomSource) {
        match self.cgroup_room {
            Some(c) if c < self.available => (c, RoomSource::Cgroup),
            _ => (self.available, RoomSource::Host),
        }
    }
}

/// A `/proc/meminfo` field (`Name:   123 kB`) in bytes.
fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        let mut words = rest.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// A cgroup's limit at or above this many bytes means "no limit" (cgroup
/// v1 writes the largest page-aligned `i64` for it).
const NO_LIMIT: u64 = 1 << 62;

/// The tightest room over this process's memory cgroups (`own` is the text
/// of `/proc/self/cgroup`) and every cgroup above them, under
/// `cgroup_root`; `None` where none has a limit.
fn cgroup_room(own: &str, cgroup_root: &Path) -> Option<u64> {
    let mut rooms = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            // cgroup v2: one unified hierarchy.
            for dir in own_and_above(cgroup_root, path) {
                rooms.extend(room_of(&dir, "memory.max", "memory.current", "file"));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let mount = cgroup_root.join("memory");
            for dir in own_and_above(&mount, path) {
                rooms.extend(room_of(
                    &dir,
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    "total_cache",
                ));
            }
        }
    }
    rooms.into_iter().min()
}

/// The folder of the cgroup `path` under `mount` and each folder above it
/// up to `mount`. Inside a cgroup namespace the path seen is `/` and the
/// mount is the cgroup itself; where the path's folder does not exist
/// (a namespace shows the path of the host), the mount alone is asked.
fn own_and_above(mount: &Path, path: &str) -> Vec<PathBuf> {
    let own = mount.join(path.trim_start_matches('/'));
    if !own.is_dir() {
        return vec![mount.to_path_buf()];
    }
    own.ancestors()
        .take_while(|dir| dir.starts_with(mount))
        .map(Path::to_path_buf)
        .collect()
}

/// One cgroup's room: its limit less its usage, its file cache added back;
/// `None` where it has no limit or its files cannot be read.
fn room_of(dir: &Path, limit: &str, usage: &str, cache_key: &str) -> Option<u64> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let limit: u64 = read(limit)?.trim().parse().ok()?;
    if limit >= NO_LIMIT {
        return None;
    }
    let usage: u64 = read(usage)?.trim().parse().ok()?;
    let cache = read("memory.stat")
        .and_then(|stat| {
            stat.lines().find_map(|line| {
                let (key, value) = line.split_once(' ')?;
                (key == cache_key).then(|| value.trim().parse::<u64>().ok())?
            })
        })
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(cache)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn meminfo(available_kib: u64) -> String {
        format!(
            "MemTotal:       24683584 kB\nMemFree:        100 kB\nMemAvailable:   {available_kib} kB\nBuffers: 0 kB\n"
        )
    }

    #[test]
    fn meminfo_fields_are_read_in_bytes() {
        let text = meminfo(24163164);
        assert_eq!(meminfo_bytes(&text, "MemAvailable"), Some(24163164 * 1024));
        assert_eq!(meminfo_bytes(&text, "MemTotal"), Some(24683584 * 1024));
        // A prefix of another name is not that name.
        assert_eq!(meminfo_bytes("MemAvailableX: 5 kB\n", "MemAvailable"), None);
        assert_eq!(
            meminfo_bytes("HugePages_Total: 7\n", "HugePages_Total"),
            Some(7)
        );
        assert_eq!(meminfo_bytes("MemAvailable: 5 MB\n", "MemAvailable"), None);
        assert_eq!(meminfo_bytes("MemAvailable: x kB\n", "MemAvailable"), None);
        assert_eq!(meminfo_bytes("", "MemAvailable"), None);
    }

    #[test]
    fn a_host_without_a_cgroup_limit_gives_mem_available() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, cg) = (dir.path().join("proc"), dir.path().join("cg"));
        write(&proc, "meminfo", &meminfo(8 << 20));
        write(&proc, "self/cgroup", "0::/\n");
        write(&cg, "memory.max", "max\n");
        write(&cg, "memory.current", "123\n");
        let host = HostMemory::read(&proc, &cg).unwrap();
        assert_eq!(
            host,
            HostMemory {
                total: 24683584 * 1024,
                available: 8 * GIB,
                cgroup_room: None
            }
        );
        assert_eq!(host.room(), (8 * GIB, RoomSource::Host));
        // No meminfo: nothing is known.
        assert_eq!(HostMemory::read(&dir.path().join("none"), &cg), None);
    }

    #[test]
    fn a_v2_cgroup_limit_binds_with_its_file_cache_added_back() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, cg) = (dir.path().join("proc"), dir.path().join("cg"));
        write(&proc, "meminfo", &meminfo(100 << 20));
        write(&proc, "self/cgroup", "0::/box/app\n");
        // The process's own cgroup: 8 GiB limit, 7 GiB used, 3 GiB of it
        // file cache: 4 GiB of room.
        write(&cg, "box/app/memory.max", &format!("{}\n", 8 * GIB));
        write(&cg, "box/app/memory.current", &format!("{}\n", 7 * GIB));
        write(
            &cg,
            "box/app/memory.stat",
            &format!("anon 1\nfile {}\nkernel 5\n", 3 * GIB),
        );
        let host = HostMemory::read(&proc, &cg).unwrap();
        assert_eq!(host.cgroup_room, Some(4 * GIB));
        assert_eq!(host.room(), (4 * GIB, RoomSource::Cgroup));
        // A cgroup whose room equals MemAvailable does not bind: the host's
        // figure is named (the words of the policy line).
        let tie = HostMemory {
            cgroup_room: Some(host.available),
            ..host
        };
        assert_eq!(tie.room(), (host.available, RoomSource::Host));
        // A tighter limit above it wins.
        write(&cg, "box/memory.max", &format!("{}\n", 6 * GIB));
        write(&cg, "box/memory.current", &format!("{}\n", 5 * GIB));
        assert_eq!(HostMemory::read(&proc, &cg).unwrap().cgroup_room, Some(GIB));
        // Usage above the limit is no room, not an underflow.
        write(&cg, "box/memory.current", &format!("{}\n", 9 * GIB));
        assert_eq!(HostMemory::read(&proc, &cg).unwrap().cgroup_room, Some(0));
    }

    #[test]
    fn a_v1_memory_cgroup_is_read_from_its_own_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, cg) = (dir.path().join("proc"), dir.path().join("cg"));
        write(&proc, "meminfo", &meminfo(100 << 20));
        write(
            &proc,
            "self/cgroup",
            "5:devices:/x\n4:memory:/process_api/abc\n0::/\n",
        );
        let own = "memory/process_api/abc";
        write(
            &cg,
            &format!("{own}/memory.limit_in_bytes"),
            &format!("{}\n", 16 * GIB),
        );
        write(
            &cg,
            &format!("{own}/memory.usage_in_bytes"),
            &format!("{}\n", 10 * GIB),
        );
        write(
            &cg,
            &format!("{own}/memory.stat"),
            &format!("cache 1\ntotal_cache {}\n", 2 * GIB),
        );
        // The parent and the root say "no limit".
        write(
            &cg,
            "memory/process_api/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(&cg, "memory/process_api/memory.usage_in_bytes", "1\n");
        write(&cg, "memory/memory.limit_in_bytes", "9223372036854771712\n");
        write(&cg, "memory/memory.usage_in_bytes", "1\n");
        assert_eq!(
            HostMemory::read(&proc, &cg).unwrap().cgroup_room,
            Some(8 * GIB)
        );
    }

    #[test]
    fn inside_a_cgroup_namespace_the_mount_is_the_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, cg) = (dir.path().join("proc"), dir.path().join("cg"));
        write(&proc, "meminfo", &meminfo(100 << 20));
        // The path names a folder this mount does not have.
        write(&proc, "self/cgroup", "0::/kubepods/pod1\n");
        write(&cg, "memory.max", &format!("{}\n", 2 * GIB));
        write(&cg, "memory.current", &format!("{}\n", GIB));
        assert_eq!(HostMemory::read(&proc, &cg).unwrap().cgroup_room, Some(GIB));
    }

    #[test]
    fn this_machine_reports_its_figures() {
        let host = HostMemory::current().expect("/proc/meminfo on Linux");
        assert!(host.available > 0 && host.available <= host.total);
        assert!(host.room().0 <= host.available);
    }
}
