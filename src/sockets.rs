//! The socket-table source: reads `tcp` and `tcp6`, finds which sockets are Envoy's (the process
//! holding its admin listener, through `/proc/<pid>/fd`), and counts with procnet's rule. Envoy's
//! process and the listeners seen are remembered from one count to the next.

use crate::count::{Basis, Count};
use crate::procnet::{self, DEFAULT_EPHEMERAL, Envoy, Filter, Listeners, Rule, Table};
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub struct SocketTable {
    proc_net: PathBuf,
    filter: Filter,
    admin: SocketAddr,
    /// Where processes are listed, when the table is the live one of this machine; fixture
    /// tables have no processes behind them.
    proc_root: Option<PathBuf>,
    listeners: Listeners,
    envoy_pid: Option<u32>,
}

impl SocketTable {
    pub fn new(proc_net: &Path, filter: Filter, admin: SocketAddr) -> SocketTable {
        SocketTable {
            proc_net: proc_net.to_path_buf(),
            filter,
            admin,
            proc_root: proc_net
                .starts_with("/proc")
                .then(|| PathBuf::from("/proc")),
            listeners: Listeners::default(),
            envoy_pid: None,
        }
    }

    /// `/proc/net/tcp and tcp6`, for log lines.
    pub fn names(&self) -> String {
        format!("{}/tcp and tcp6", self.proc_net.display())
    }

    /// The kernel's count. Either table may be missing (no IPv6); both missing or unreadable is
    /// an error.
    pub fn count(&mut self) -> Result<Count, String> {
        let mut table = Table::default();
        let mut failures = Vec::new();
        let mut read_any = false;
        for name in ["tcp", "tcp6"] {
            let path = self.proc_net.join(name);
            match read_table(&path, &mut table) {
                Ok(()) => read_any = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => failures.push(format!("failed to read {}: {e}", path.display())),
            }
        }
        if !read_any {
            return Err(if failures.is_empty() {
                format!(
                    "neither {0}/tcp nor {0}/tcp6 exists",
                    self.proc_net.display()
                )
            } else {
                failures.join("; ")
            });
        }
        let (envoy, basis) = self.envoy(&table);
        let rule = Rule {
            filter: &self.filter,
            envoy: &envoy,
            ephemeral: self.ephemeral(),
        };
        let mut count = procnet::count(&table, &rule, &mut self.listeners).with_basis(basis);
        count.warnings.extend(failures);
        Ok(count)
    }

    /// Who Envoy is, and a sentence saying how that was found.
    fn envoy(&mut self, table: &Table) -> (Envoy, Basis) {
        let admin = self.admin;
        let Some(listener) = table.listener(admin) else {
            let text = format!(
                "nothing listens on Envoy's admin address {admin}, so Envoy's sockets cannot be \
                 told apart: counting what any listener of the pod accepted"
            );
            return (
                Envoy::Unknown,
                Basis {
                    text,
                    degraded: true,
                },
            );
        };
        let uid = listener.uid;
        let found = match &self.proc_root {
            Some(root) => find_holder(root, listener.inode, uid, self.envoy_pid),
            None => Err(format!("{} is not a live table", self.proc_net.display())),
        };
        match found {
            Ok((pid, inodes)) => {
                self.envoy_pid = Some(pid);
                let text = format!(
                    "counting what Envoy accepted: Envoy is pid {pid} (uid {uid}), which holds the \
                     admin listener {admin}"
                );
                let basis = Basis {
                    text,
                    degraded: false,
                };
                (Envoy::Process { pid, uid, inodes }, basis)
            }
            Err(why) => {
                let text = format!(
                    "counting what Envoy accepted, telling its sockets by their owner, uid {uid}, \
                     the owner of the admin listener {admin} ({why})"
                );
                let basis = Basis {
                    text,
                    degraded: false,
                };
                (Envoy::User { uid }, basis)
            }
        }
    }

    /// The range connect() picks local ports from, in this network namespace; fixture tables
    /// get the kernel's default.
    fn ephemeral(&self) -> (u16, u16) {
        let read = |root: &PathBuf| {
            let text = fs::read_to_string(root.join("sys/net/ipv4/ip_local_port_range")).ok()?;
            let mut ports = text.split_ascii_whitespace().map(str::parse::<u16>);
            Some((ports.next()?.ok()?, ports.next()?.ok()?))
        };
        self.proc_root
            .as_ref()
            .and_then(read)
            .unwrap_or(DEFAULT_EPHEMERAL)
    }
}

/// Streams a table line by line: 18,000 sockets are 2.7 MB of text that need not sit in memory.
fn read_table(path: &Path, table: &mut Table) -> std::io::Result<()> {
    let mut reader = BufReader::with_capacity(64 * 1024, File::open(path)?);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        table.add_line(&String::from_utf8_lossy(&line));
    }
}

/// The socket inodes a process holds.
fn sockets_of(proc_root: &Path, pid: u32) -> std::io::Result<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for entry in fs::read_dir(proc_root.join(pid.to_string()).join("fd"))? {
        // A descriptor closed between the listing and the readlink is simply gone.
        let Ok(target) = entry.and_then(|e| fs::read_link(e.path())) else {
            continue;
        };
        let inode = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok());
        if let Some(inode) = inode {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// The process holding socket `inode` (owned by `uid`), and every socket it holds. `last`, the
/// process found before, is tried first: Envoy's pid does not change within a run.
fn find_holder(
    proc_root: &Path,
    inode: u64,
    uid: u32,
    last: Option<u32>,
) -> Result<(u32, HashSet<u64>), String> {
    if let Some(pid) = last
        && let Ok(inodes) = sockets_of(proc_root, pid)
        && inodes.contains(&inode)
    {
        return Ok((pid, inodes));
    }
    let dir = fs::read_dir(proc_root)
        .map_err(|e| format!("failed to list {}: {e}", proc_root.display()))?;
    let mut denied = None;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // /proc/<pid> belongs to the process's user: only Envoy's user can hold its listener.
        if entry.metadata().map(|m| m.uid()).ok() != Some(uid) {
            continue;
        }
        match sockets_of(proc_root, pid) {
            Ok(inodes) if inodes.contains(&inode) => return Ok((pid, inodes)),
            Ok(_) => {}
            Err(e) => {
                denied = Some(format!(
                    "failed to read {}/{pid}/fd: {e}",
                    proc_root.display()
                ))
            }
        }
    }
    Err(denied.unwrap_or_else(|| format!("no process of uid {uid} shows socket:[{inode}] here")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    /// This process's own listening socket is found as its own, with every socket it holds.
    #[test]
    fn the_holder_of_a_socket_is_found_with_all_its_sockets() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let inode = |fd: i32| -> u64 {
            let link = fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
            let text = link.to_str().unwrap().to_string();
            text["socket:[".len()..text.len() - 1].parse().unwrap()
        };
        let (mine, theirs) = (inode(listener.as_raw_fd()), inode(other.as_raw_fd()));
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let me = std::process::id();
        let (pid, inodes) = find_holder(Path::new("/proc"), mine, uid, None).unwrap();
        assert_eq!(pid, me);
        assert!(inodes.contains(&mine) && inodes.contains(&theirs));
        let again = find_holder(Path::new("/proc"), mine, uid, Some(me)).unwrap();
        assert_eq!(again.0, me);
        let e = find_holder(Path::new("/proc"), u64::MAX, uid, Some(me)).unwrap_err();
        assert!(e.contains("shows socket:[18446744073709551615]"), "{e}");
    }
}
