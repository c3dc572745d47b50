//! The two ways to count: Envoy's stats over the admin API, and the kernel's socket table. `auto`
//! tries stats and falls back to the table for any count where stats cannot answer.

use crate::admin::Client;
use crate::config::{Counting, Mode};
use crate::count::{Count, Unit};
use crate::procnet::{Filter, Tally};
use crate::stats::{self, REQUESTS_PATH, STATS_PATH};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

/// One attempt to count.
#[derive(Debug, Clone)]
pub struct Reading {
    /// The count, or why nothing could be counted.
    pub result: Result<Count, String>,
    /// Why the preferred count was not made this time, if it was not: the stats did not answer
    /// (auto falls back to the socket table), or did not report requests (connections instead).
    pub fallback: Option<String>,
}

pub struct Sources {
    pub mode: Mode,
    pub unit: Unit,
    pub admin: Client,
    proc_net: PathBuf,
    filter: Filter,
}

impl Sources {
    pub fn new(c: &Counting) -> Sources {
        Sources {
            mode: c.mode,
            unit: c.unit,
            admin: Client::new(c.admin),
            proc_net: c.proc_net.clone(),
            filter: c.filter(),
        }
    }

    /// `/proc/net/tcp and tcp6`, for log lines.
    pub fn proc_names(&self) -> String {
        format!("{}/tcp and tcp6", self.proc_net.display())
    }

    /// One query for whatever is counted: connections, or connections and requests together.
    fn stats_path(&self) -> &'static str {
        match self.unit {
            Unit::Connections => STATS_PATH,
            Unit::Requests => REQUESTS_PATH,
        }
    }

    pub fn stats_url(&self) -> String {
        self.admin.url(self.stats_path())
    }

    /// Counts by the configured mode and unit within `left`. Requests that Envoy does not report
    /// become a connection count from its stats; stats that do not answer become, in auto mode,
    /// a connection count from the socket table. The count says which it is.
    pub fn count(&self, left: Duration) -> Reading {
        if self.mode == Mode::Proc {
            return Reading {
                result: self.proc(),
                fallback: None,
            };
        }
        let stats = self.stats_body(left).and_then(|body| match self.unit {
            Unit::Connections => self.connections(&body).map(|a| (a.count, None)),
            Unit::Requests => match self.requests(&body) {
                Ok((a, _)) => Ok((a.count, None)),
                Err(why) => self.connections(&body).map(|a| (a.count, Some(why))),
            },
        });
        match stats {
            Ok((count, fallback)) => Reading {
                result: Ok(count),
                fallback,
            },
            Err(why) if self.mode == Mode::Stats => Reading {
                result: Err(why),
                fallback: None,
            },
            Err(why) => Reading {
                result: self
                    .proc()
                    .map_err(|proc| format!("stats: {why}; proc: {proc}")),
                fallback: Some(why),
            },
        }
    }

    /// Envoy's answer as text. Any failure (refused, timeout, non-200, bytes that are not text)
    /// is an error: unknown, never zero.
    pub fn stats_body(&self, left: Duration) -> Result<String, String> {
        let url = self.stats_url();
        let reply = self
            .admin
            .get(self.stats_path(), left)
            .map_err(|e| format!("GET {url} failed: {e}"))?;
        if reply.status != 200 {
            return Err(format!("GET {url} answered {}", reply.describe()));
        }
        String::from_utf8(reply.body)
            .map_err(|_| format!("GET {url} answered with bytes that are not text"))
    }

    /// Envoy's connection count from an answer; a stat that is not enabled is an error.
    pub fn connections(&self, body: &str) -> Result<stats::Answer, String> {
        stats::parse(body, &self.filter.ignore).map_err(|_| not_reported("downstream_cx_active"))
    }

    /// Envoy's request count, and the requests and connections per HTTP connection manager.
    pub fn requests(&self, body: &str) -> Result<(stats::Answer, Vec<stats::Hcm>), String> {
        stats::parse_requests(body, &self.filter.ignore)
            .map_err(|_| not_reported("downstream_rq_active"))
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

fn not_reported(stat: &str) -> String {
    format!("Envoy does not report {stat} (its stats_matcher leaves the stat out)")
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
            unit: Unit::Connections,
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
        assert!(r.fallback.unwrap().ends_with("failed: connection refused"));
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
