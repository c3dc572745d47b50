//! The two ways to count: Envoy's stats over the admin API, and the kernel's socket table. `auto`
//! tries stats and falls back to the table for any count where stats cannot answer.

use crate::admin::Client;
use crate::config::{Counting, Mode};
use crate::count::Count;
use crate::procnet::{Filter, Tally};
use crate::stats::{self, STATS_PATH};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

/// One attempt to count.
#[derive(Debug, Clone)]
pub struct Reading {
    /// The count, or why nothing could be counted.
    pub result: Result<Count, String>,
    /// In auto mode: why the stats did not answer this time, if they did not.
    pub stats_failed: Option<String>,
}

pub struct Sources {
    pub mode: Mode,
    pub admin: Client,
    proc_net: PathBuf,
    filter: Filter,
}

impl Sources {
    pub fn new(c: &Counting) -> Sources {
        Sources {
            mode: c.mode,
            admin: Client::new(c.admin),
            proc_net: c.proc_net.clone(),
            filter: c.filter(),
        }
    }

    /// `/proc/net/tcp and tcp6`, for log lines.
    pub fn proc_names(&self) -> String {
        format!("{}/tcp and tcp6", self.proc_net.display())
    }

    pub fn stats_url(&self) -> String {
        self.admin.url(STATS_PATH)
    }

    /// Counts by the configured mode within `left`.
    pub fn count(&self, left: Duration) -> Reading {
        match self.mode {
            Mode::Stats => Reading {
                result: self.stats(left).map(|a| a.count),
                stats_failed: None,
            },
            Mode::Proc => Reading {
                result: self.proc(),
                stats_failed: None,
            },
            Mode::Auto => match self.stats(left) {
                Ok(a) => Reading {
                    result: Ok(a.count),
                    stats_failed: None,
                },
                Err(why) => Reading {
                    result: self
                        .proc()
                        .map_err(|proc| format!("stats: {why}; proc: {proc}")),
                    stats_failed: Some(why),
                },
            },
        }
    }

    /// Envoy's own count. Any failure (refused, timeout, non-200, a body that is not text, the
    /// stat not enabled) is an error: unknown, never zero.
    pub fn stats(&self, left: Duration) -> Result<stats::Answer, String> {
        let reply = self
            .admin
            .get(STATS_PATH, left)
            .map_err(|e| format!("GET {} failed: {e}", self.stats_url()))?;
        if reply.status != 200 {
            return Err(format!(
                "GET {} answered {}",
                self.stats_url(),
                reply.describe()
            ));
        }
        let body = std::str::from_utf8(&reply.body).map_err(|_| {
            format!(
                "GET {} answered with bytes that are not text",
                self.stats_url()
            )
        })?;
        stats::parse(body, &self.filter.ignore).map_err(|_| {
            "Envoy does not report downstream_cx_active (its stats_matcher leaves the stat out)"
                .to_string()
        })
    }

    /// The kernel's count. Either table may be missing (no IPv6); both missing or unreadable is
    /// an error.
    pub fn proc(&self) -> Result<Count, String> {
        let mut tally = Tally::default();
        let mut failures = Vec::new();
        let mut read_any = false;
        for name in ["tcp", "tcp6"] {
            let path = self.proc_net.join(name);
            match read_table(&path, &mut tally, &self.filter) {
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
        let mut count = tally.finish();
        count.warnings.extend(failures);
        Ok(count)
    }
}

/// Streams a table line by line: 18,000 sockets are 2.7 MB of text that need not sit in memory.
fn read_table(path: &std::path::Path, tally: &mut Tally, filter: &Filter) -> std::io::Result<()> {
    let mut reader = BufReader::with_capacity(64 * 1024, File::open(path)?);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        tally.add_line(&String::from_utf8_lossy(&line), filter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::count::SourceKind;
    use crate::ports::PortSet;
    use std::net::{SocketAddr, TcpListener};

    /// A loopback port nothing listens on: bound, then closed.
    fn refused() -> SocketAddr {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    fn dir(name: &str, tcp: Option<&str>) -> PathBuf {
        let d = std::env::temp_dir().join(format!("envoy-drain-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        if let Some(text) = tcp {
            std::fs::write(d.join("tcp"), text).unwrap();
        }
        d
    }

    fn sources(mode: Mode, proc_net: PathBuf) -> Sources {
        Sources::new(&Counting {
            admin: refused(),
            mode,
            ignore: PortSet::default(),
            only: None,
            proc_net,
        })
    }

    const ONE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 0200007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1 1
";

    #[test]
    fn auto_falls_back_to_the_socket_table_and_says_why() {
        let d = dir("auto", Some(ONE));
        let r = sources(Mode::Auto, d.clone()).count(Duration::from_secs(1));
        std::fs::remove_dir_all(&d).unwrap();
        let c = r.result.unwrap();
        assert_eq!((c.source, c.total), (SourceKind::Proc, 1));
        assert!(
            r.stats_failed
                .unwrap()
                .ends_with("failed: connection refused")
        );
    }

    #[test]
    fn stats_only_does_not_fall_back() {
        let d = dir("stats-only", Some(ONE));
        let r = sources(Mode::Stats, d.clone()).count(Duration::from_secs(1));
        std::fs::remove_dir_all(&d).unwrap();
        assert!(r.result.unwrap_err().contains("connection refused"));
    }

    #[test]
    fn one_table_missing_is_fine_both_missing_is_unknown() {
        let d = dir("missing", Some(ONE));
        assert_eq!(sources(Mode::Proc, d.clone()).proc().unwrap().total, 1);
        std::fs::remove_file(d.join("tcp")).unwrap();
        let e = sources(Mode::Proc, d.clone()).proc().unwrap_err();
        std::fs::remove_dir_all(&d).unwrap();
        assert!(
            e.starts_with("neither ") && e.ends_with("/tcp6 exists"),
            "{e}"
        );
    }

    #[test]
    fn auto_with_nothing_answering_is_unknown_and_names_both_causes() {
        let d = dir("nothing", None);
        let r = sources(Mode::Auto, d.clone()).count(Duration::from_secs(1));
        std::fs::remove_dir_all(&d).unwrap();
        let e = r.result.unwrap_err();
        assert!(
            e.starts_with("stats: GET http://127.0.0.1:") && e.contains("; proc: neither"),
            "{e}"
        );
    }

    #[test]
    fn no_time_left_means_no_request() {
        let r = sources(Mode::Stats, PathBuf::from("/nonexistent")).count(Duration::ZERO);
        assert!(
            r.result
                .unwrap_err()
                .ends_with("no time left before the deadline")
        );
    }
}
