//! The benchmarks behind BENCHMARKS.md: size, memory and CPU of a waiting hook, time to the first
//! count, counting 2,000 to 60,000 sockets by netlink and by the text tables against ss, netstat
//! and the kernel's floor (also from a quiet namespace beside a busy one), reaction latency
//! against Istio's own policy, the cost of /clusters at 1,000 clusters, and SIGTERM to exit (the
//! pod shutdown of section 8 is the demo's, run by scripts/bench). Figures are printed as
//! Markdown, never asserted. Run it with `bash scripts/bench`, which builds what it measures.

#[allow(dead_code)]
#[path = "../tests/support"]
mod support {
    pub mod app;
    pub mod envoy;
    pub mod h2;
    pub mod http;
    pub mod netns;
}

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use support::envoy::{Envoy, EnvoyOptions, INBOUND};
use support::http::Conn;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, verb, n] = &args[..]
        && verb == "hold"
    {
        hold(n.parse().expect("a number of connections"));
        return;
    }
    let drain = PathBuf::from(
        std::env::var_os("ENVOY_DRAIN").unwrap_or_else(|| "target/dist/amd64/envoy-drain".into()),
    );
    let envoy = match support::envoy::binary() {
        Ok(bin) => bin,
        Err(why) => {
            eprintln!("bench: {why}; run it as `bash scripts/bench`, which installs Envoy");
            std::process::exit(2);
        }
    };
    if let [_, verb, sizes @ ..] = &args[..]
        && verb == "scale-hold"
    {
        scale_hold(&drain, &envoy, sizes);
        return;
    }
    if let [_, verb] = &args[..]
        && verb == "scale"
    {
        println!("{}", support::netns::in_private_netns(move || scale(&drain, &envoy)));
        return;
    }
    println!("{}", sizes());
    let (d, e) = (drain.clone(), envoy.clone());
    println!("{}", support::netns::in_private_netns(move || waiting_costs(&d, &e)));
    let (d, e) = (drain.clone(), envoy.clone());
    println!("{}", support::netns::in_private_netns(move || first_count(&d, &e)));
    let d = drain.clone();
    println!("{}", support::netns::in_private_netns(move || socket_table(&d)));
    let (d, e) = (drain.clone(), envoy.clone());
    println!("{}", support::netns::in_private_netns(move || reaction(&d, &e)));
    let (d, e) = (drain.clone(), envoy.clone());
    println!("{}", support::netns::in_private_netns(move || clusters_cost(&d, &e)));
    let (d, e) = (drain.clone(), envoy.clone());
    println!("{}", support::netns::in_private_netns(move || signal(&d, &e)));
}

/// `hold` on a sidecar of each size in `sizes` (clusters; 10,000 and 50,000 where none is given),
/// a row each.
fn scale_hold(drain: &Path, envoy: &Path, sizes: &[String]) {
    let mut sizes: Vec<usize> =
        sizes.iter().map(|n| n.parse().expect("a number of clusters")).collect();
    if sizes.is_empty() {
        sizes = vec![10_000, 50_000];
    }
    print!("{HOLD_HEADER}");
    for n in sizes {
        let (drain, envoy) = (drain.to_path_buf(), envoy.to_path_buf());
        print!(
            "{}",
            support::netns::in_private_netns(move || {
                let dir =
                    std::env::temp_dir().join(format!("envoy-drain-hold-{}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("a temporary directory");
                let row = hold_row(&drain, &envoy, &dir, n);
                let _ = std::fs::remove_dir_all(&dir);
                row
            })
        );
    }
}

/// An Envoy with 1,000 clusters of 3 hosts (`clusters_envoy`): what `--count requests` reads
/// from /clusters on a large unscoped sidecar.
fn clusters_cost(drain: &Path, envoy: &Path) -> String {
    const CLUSTERS: usize = 1000;
    let dir = std::env::temp_dir().join(format!("envoy-drain-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut child = clusters_envoy(envoy, &dir, CLUSTERS, false);
    let live = support::envoy::until(Duration::from_secs(30), support::envoy::live);
    let mut bytes = 0;
    let mut answers = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let body = Conn::open(support::envoy::ADMIN)
            .and_then(|mut c| c.get("/clusters"))
            .map(|r| r.body)
            .unwrap_or_default();
        answers.push(started.elapsed());
        bytes = body.len();
    }
    let (count, said) = status_time(drain, &["--count", "requests", "--source", "stats"], 15);
    // Nothing in flight: a 3 s settle time keeps it counting every 500 ms.
    let hook = Command::new(drain)
        .args("run --count requests --drain none --min-drain 0s --settle 3s --verbose".split(' '))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("envoy-drain starts");
    let (rss_kib, cpu) = wait_usage(hook);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "## 6. `--count requests` from /clusters at 1,000 clusters\n\nEnvoy 1.40.0 with {CLUSTERS} clusters of 3 hosts named as istiod \
         names them (`outbound|8080||service-0001.namespace-01.svc.cluster.local`) and Istio's default stats matcher, so \
         requests come from `GET /clusters` (Envoy up: {live}).\n\n\
         | figure | value |\n|---|---:|\n\
         | size of the /clusters answer | {bytes} bytes |\n\
         | Envoy's answer, read whole (20 trials) | median {:.1} ms, max {:.1} ms |\n\
         | `status --count requests --source stats` (stats, then /clusters; 15 trials) | median {:.1} ms |\n\
         | a waiting hook counting from it every 500 ms for 3 s: peak RSS | {:.2} MiB |\n\
         | the same: CPU time | {:.1} ms |\n\n\
         The answer holds every cluster and host, about 2 KB a host, so envoy-drain reads it line by line as it arrives \
         and keeps only three counters a host: memory stays flat whatever its size, and only the deadline bounds how \
         long it may take (section 9 goes to 50,000 clusters). Last status line: `{said}`.\n",
        ms(median(answers.clone())),
        ms(answers.iter().max().copied().unwrap_or_default()),
        ms(count),
        rss_kib as f64 / 1024.0,
        ms(cpu),
    )
}

fn sizes() -> String {
    let mut out = String::from("## 1. Binary size\n\n| binary | bytes | KiB |\n|---|---:|---:|\n");
    for arch in ["amd64", "arm64"] {
        let path = format!("target/dist/{arch}/envoy-drain");
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        out += &format!("| `{path}` (static, stripped) | {size} | {} |\n", size / 1024);
    }
    out
}

/// Waits for the child, reading its peak RSS (VmHWM, KiB) from /proc while it runs, and its CPU
/// time from wait4. wait4's own ru_maxrss would count the bench's pages: a spawned child starts
/// as a copy of its parent until it execs.
fn wait_usage(child: std::process::Child) -> (u64, Duration) {
    let pid = child.id() as i32;
    let status_file = format!("/proc/{pid}/status");
    let mut peak = 0;
    loop {
        let hwm = std::fs::read_to_string(&status_file).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        });
        match hwm {
            Some(kib) => peak = peak.max(kib),
            // Exited (a zombie has no VmHWM line) or gone.
            None => break,
        }
        thread::sleep(Duration::from_millis(20));
    }
    let mut status = 0;
    // SAFETY: rusage is plain data filled by wait4 for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (peak, tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// `run` with `args`, its log read as it comes: its lines, peak RSS (KiB) and CPU time.
fn watched_run(drain: &Path, args: &[&str]) -> (Vec<String>, u64, Duration) {
    let mut child = Command::new(drain)
        .arg("run")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("envoy-drain starts");
    let err = child.stderr.take().expect("stderr");
    let lines = thread::spawn(move || {
        BufReader::new(err).lines().map_while(Result::ok).collect::<Vec<_>>()
    });
    let (rss_kib, cpu) = wait_usage(child);
    (lines.join().unwrap_or_default(), rss_kib, cpu)
}

/// A 3 s wait with one connection open, from each source: peak RSS, and CPU per count.
fn waiting_costs(drain: &Path, envoy: &Path) -> String {
    let _envoy = Envoy::start(envoy, EnvoyOptions::default());
    let mut idle = Conn::open(INBOUND).expect("inbound listener");
    let _ = idle.get("/ok");
    let mut out = String::from(
        "## 2. A waiting hook: memory and CPU\n\n`run --deadline 3s --min-drain 0s --verbose` with one idle connection open \
         (it waits the full 3 s), default 500 ms interval. Peak RSS is the process's VmHWM, read every 20 ms until it exits.\n\n| source | peak RSS | CPU time | counts | CPU per count |\n|---|---:|---:|---:|---:|\n",
    );
    let note = "\nThe proc count's CPU is mostly the kernel's: either reader walks the whole established-socket hash table, \
                which all network namespaces share, so even a namespace with two sockets pays for the host's; netlink skips \
                the text (section 4).\n";
    for (name, source, extra) in [
        ("stats", "stats", &[][..]),
        ("proc, netlink", "proc", &[][..]),
        ("proc, text tables", "proc", &["--proc-net", "/proc/net"][..]),
    ] {
        let (lines, rss_kib, cpu) = watched_run(
            drain,
            &[
                &[
                    "--drain",
                    "none",
                    "--source",
                    source,
                    "--deadline",
                    "3s",
                    "--min-drain",
                    "0s",
                    "--verbose",
                ],
                extra,
            ]
            .concat(),
        );
        // With --verbose every count is a line whose message starts with the count.
        let counts = lines
            .iter()
            .filter_map(|l| l.split('\t').nth(3))
            .filter(|m| m.starts_with(|c: char| c.is_ascii_digit()))
            .count()
            .max(1);
        out += &format!(
            "| {name} | {:.2} MiB | {:.1} ms | {counts} | {:.2} ms |\n",
            rss_kib as f64 / 1024.0,
            cpu.as_secs_f64() * 1000.0,
            cpu.as_secs_f64() * 1000.0 / counts as f64,
        );
    }
    out + note
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// From starting `run` to its first count line, against a real Envoy.
fn first_count(drain: &Path, envoy: &Path) -> String {
    let mut times = Vec::new();
    for _ in 0..10 {
        let _envoy = Envoy::start(envoy, EnvoyOptions::default());
        let started = Instant::now();
        let mut child = Command::new(drain)
            .args(["run", "--min-drain", "0s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("envoy-drain starts");
        let err = child.stderr.take().expect("stderr");
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains(" active connection") {
                times.push(started.elapsed());
                break;
            }
        }
        let _ = child.wait();
    }
    let max = times.iter().max().copied().unwrap_or_default();
    format!(
        "## 3. Start to first count\n\nFrom spawning `run` (default: drain inbound, then count from stats) to its first count line, \
         against a real Envoy 1.40.0, 10 trials: median {:.2} ms, max {:.2} ms.\n",
        median(times).as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    )
}

/// The most connections one holder keeps: both ends take a descriptor, and the container's hard
/// limit on descriptors (20,000 here) cannot be raised without CAP_SYS_RESOURCE.
const PER_HOLDER: usize = 7_000;

/// `bench hold N`: opens N loopback connections to a listener of its own, says "ready", and keeps
/// them until its stdin closes.
fn hold(n: usize) {
    let limit =
        libc::rlimit { rlim_cur: 2 * PER_HOLDER as u64 + 64, rlim_max: 2 * PER_HOLDER as u64 + 64 };
    // SAFETY: setrlimit with a valid struct, within the hard limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let held: Vec<_> = (0..n)
        .map(|_| {
            let client = TcpStream::connect(addr).expect("connect");
            (client, listener.accept().expect("accept"))
        })
        .collect();
    println!("ready");
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    drop(held);
}

/// Processes in this thread's namespace that hold `n` loopback connections (2n sockets) between
/// them, each ready when this returns; or why they could not.
fn holders(n: usize, children: &mut Vec<std::process::Child>) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut left = n;
    while left > 0 {
        let here = left.min(PER_HOLDER);
        let mut child = Command::new(&me)
            .args(["hold", &here.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("a holder did not start: {e}"))?;
        let mut ready = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut ready);
        }
        children.push(child);
        if ready.trim() != "ready" {
            return Err(format!("a holder of {here} connections did not get them all"));
        }
        left -= here;
    }
    Ok(())
}

/// The ways to count a namespace's TCP sockets, each as a shell command.
fn counters(drain: &Path) -> [(&'static str, String); 5] {
    let d = drain.display();
    [
        ("envoy-drain, netlink", format!("{d} status --source proc")),
        ("envoy-drain, text", format!("{d} status --source proc --proc-net /proc/net")),
        ("ss", "ss -Htn state established | wc -l".to_string()),
        ("netstat", "netstat -tn | grep -c ESTABLISHED".to_string()),
        ("floor", "cat /proc/net/tcp /proc/net/tcp6 > /dev/null".to_string()),
    ]
}

/// Each counter's median wall time over 15 runs, in this thread's namespace, and the last
/// line it printed.
fn time_counters(drain: &Path) -> Vec<(Duration, String)> {
    counters(drain)
        .iter()
        .map(|(_, cmd)| {
            let mut times = Vec::new();
            let mut said = String::new();
            for _ in 0..15 {
                let started = Instant::now();
                let out = Command::new("sh")
                    .args(["-c", cmd])
                    .stderr(Stdio::null())
                    .output()
                    .expect("runs");
                times.push(started.elapsed());
                said = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
            }
            (median(times), said)
        })
        .collect()
}

/// One table row: the medians, then netlink's time against ss, netstat and the floor, and the
/// text reader's against ss.
fn counters_row(label: &str, t: &[(Duration, String)]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    let count = |said: &str| said.split_whitespace().nth(3).unwrap_or("?").to_string();
    format!(
        "| {label} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.2}x | {:.2}x | {:.2}x | {:.2}x | {} / {} / {} |\n",
        ms(t[0].0),
        ms(t[1].0),
        ms(t[2].0),
        ms(t[3].0),
        ms(t[4].0),
        ratio(t[0].0, t[2].0),
        ratio(t[0].0, t[3].0),
        ratio(t[0].0, t[4].0),
        ratio(t[1].0, t[2].0),
        count(&t[0].1),
        count(&t[1].1),
        t[2].1,
    )
}

/// The socket table at 2,000, 18,000 and 60,000 sockets in this namespace, and in a quiet
/// namespace beside 18,000 sockets in this one, counted five ways.
fn socket_table(drain: &Path) -> String {
    let mut out = String::from(
        "## 4. SourceConfig sockets: netlink, the text tables, ss and netstat\n\n\
         Loopback connections held open (both ends: 2 ESTABLISHED sockets each); wall time of each whole command, median \
         of 15 runs, all in one run. envoy-drain is `status --source proc` (netlink) and the same with `--proc-net /proc/net` \
         (text); ss is `ss -Htn state established | wc -l`; netstat is `netstat -tn | grep -c ESTABLISHED`; the floor is \
         `cat /proc/net/tcp /proc/net/tcp6 > /dev/null`, the least any reader of the text can take. The last column is \
         what each counted: connections Envoy could have accepted (netlink / text), and ESTABLISHED sockets (ss).\n\n\
         | sockets | netlink | text | ss | netstat | floor | netlink / ss | netlink / netstat | netlink / floor | text / ss | counted |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let quiet = support::netns::Netns::new();
    let mut held = Vec::new();
    let mut open = 0;
    for n in [1_000, 9_000, 30_000] {
        if let Err(why) = holders(n - open, &mut held) {
            out += &format!("\nNot measured at {} sockets and beyond: {why}.\n", 2 * n);
            break;
        }
        open = n;
        out += &counters_row(&format!("{} in the namespace", 2 * n), &time_counters(drain));
        if n == 9_000 {
            let beside = quiet.enter(|| time_counters(drain));
            out += &counters_row("0 in the namespace, 18000 in another", &beside);
        }
    }
    for mut child in held {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    out + "\nEvery reader pays for the whole established-socket hash table, which all namespaces share: the text tables \
         by formatting a line per socket of this namespace and skipping the others, netlink by a binary message per socket \
         the kernel has already filtered by state. One netlink request (`inet_diag_req` v1) walks the table once for \
         IPv4 and IPv6.\n"
}

/// From the last connection closing to `run` exiting, 20 trials; beside it Istio's policy
/// (sleep MINIMUM_DRAIN_DURATION, then count every 1 s, exit at zero) for the same close times.
fn reaction(drain: &Path, envoy: &Path) -> String {
    const MIN_DRAIN: f64 = 1.0;
    let _envoy = Envoy::start(envoy, EnvoyOptions::default());
    let mut ours = Vec::new();
    let mut istio = Vec::new();
    for trial in 0..20u32 {
        let mut conn = Conn::open(INBOUND).expect("inbound listener");
        let _ = conn.get("/ok");
        let started = Instant::now();
        let mut child = Command::new(drain)
            .args(["run", "--drain", "none", "--min-drain", "1s", "--deadline", "10s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("envoy-drain starts");
        // Close times spread over 1.0 s to 2.5 s after the start, past the min-drain.
        let close_at = MIN_DRAIN + f64::from((trial * 37) % 150) / 100.0;
        thread::sleep(Duration::from_secs_f64(close_at).saturating_sub(started.elapsed()));
        drop(conn);
        let closed = started.elapsed().as_secs_f64();
        let _ = child.wait();
        let exited = started.elapsed().as_secs_f64();
        ours.push(exited - closed);
        let istio_exit =
            if closed <= MIN_DRAIN { MIN_DRAIN } else { MIN_DRAIN + (closed - MIN_DRAIN).ceil() };
        istio.push(istio_exit - closed);
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (v[v.len() / 2] * 1000.0, mean * 1000.0, v[v.len() - 1] * 1000.0)
    };
    let (om, oa, ox) = stats(&mut ours);
    let (im, ia, ix) = stats(&mut istio);
    format!(
        "## 5. Reaction latency\n\nFrom the last client connection closing to the hook ending, real Envoy 1.40.0, 20 trials with the \
         close spread over 1.0-2.5 s after the start, min-drain 1 s for both.\n\n| policy | median | mean | max |\n|---|---:|---:|---:|\n\
         | envoy-drain (count every 500 ms) | {om:.0} ms | {oa:.0} ms | {ox:.0} ms |\n\
         | Istio EXIT_ON_ZERO_ACTIVE_CONNECTIONS (sleep 1 s, count every 1 s), same close times | {im:.0} ms | {ia:.0} ms | {ix:.0} ms |\n"
    )
}

/// From SIGTERM during the wait to the process's exit, summary line included.
fn signal(drain: &Path, envoy: &Path) -> String {
    let _envoy = Envoy::start(envoy, EnvoyOptions::default());
    let mut conn = Conn::open(INBOUND).expect("inbound listener");
    let _ = conn.get("/ok");
    let mut times = Vec::new();
    let mut summaries = 0;
    let mut other = String::new();
    for _ in 0..10 {
        let mut child = Command::new(drain)
            .args(["run", "--drain", "none", "--deadline", "30s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("envoy-drain starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        // Waiting once the first count is logged.
        for line in lines.by_ref().map_while(Result::ok) {
            if line.contains(" active connection") {
                break;
            }
        }
        let sent = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let summary = lines.map_while(Result::ok).last().unwrap_or_default();
        let _ = child.wait();
        times.push(sent.elapsed());
        if summary.contains("interrupted by SIGTERM") {
            summaries += 1;
        } else {
            other = summary;
        }
    }
    let max = times.iter().max().copied().unwrap_or_default();
    let mut out = format!(
        "## 7. SIGTERM to exit\n\nFrom SIGTERM during the wait to the process's exit with its summary line written, 10 trials: \
         median {:.2} ms, max {:.2} ms (the promise is 100 ms); {summaries} of 10 ended with the SIGTERM summary line.\n",
        median(times).as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );
    if summaries < 10 {
        out += &format!("\nThe last line of another trial: `{other}`.\n");
    }
    out
}

/// Envoy with `n` clusters of 3 hosts, named as istiod names them, and Istio's default stats
/// matcher, so that requests come from /clusters: a large unscoped sidecar, or a gateway.
/// Envoy with `n` outbound clusters of 3 hosts; with `inbound`, also the app's inbound cluster
/// (`inbound|8080||`, to the app on 8080) and Istio's inbound listener (15006) in front of it.
fn clusters_envoy(envoy: &Path, dir: &Path, n: usize, inbound: bool) -> std::process::Child {
    let mut yaml = String::from(
        "admin:\n  address: { socket_address: { address: 127.0.0.1, port_value: 15000 } }\n\
         stats_config:\n  stats_matcher:\n    inclusion_list:\n      patterns:\n      - prefix: \"istio\"\n\
         static_resources:\n  clusters:\n",
    );
    for i in 0..n {
        let name =
            format!("outbound|8080||service-{i:05}.namespace-{:02}.svc.cluster.local", i % 50);
        yaml += &format!(
            "  - name: \"{name}\"\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      cluster_name: \"{name}\"\n      endpoints:\n      - lb_endpoints:\n"
        );
        for h in 1..=3 {
            yaml += &format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: 10.{}.{}.{h}, port_value: 8080 }} }} }}\n",
                i / 250,
                i % 250
            );
        }
    }
    if inbound {
        yaml += "  - name: \"inbound|8080||\"\n    type: STATIC\n    connect_timeout: 1s\n    load_assignment:\n      \
                 cluster_name: \"inbound|8080||\"\n      endpoints:\n      - lb_endpoints:\n        \
                 - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 8080 } } }\n  \
                 listeners:\n  - name: virtualInbound\n    address: { socket_address: { address: 0.0.0.0, port_value: 15006 } }\n    \
                 filter_chains:\n    - filters:\n      - name: envoy.filters.network.http_connection_manager\n        \
                 typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          \
                 stat_prefix: inbound_0.0.0.0_8080\n          route_config:\n            virtual_hosts:\n            \
                 - { name: app, domains: [\"*\"], routes: [{ match: { prefix: \"/\" }, route: { cluster: \"inbound|8080||\" } }] }\n          \
                 http_filters:\n          - name: envoy.filters.http.router\n            \
                 typed_config: { \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }\n";
    }
    let config = dir.join(format!("clusters-{n}.yaml"));
    std::fs::write(&config, yaml).expect("the config");
    spawn_envoy(envoy, &config)
}

fn spawn_envoy(envoy: &Path, config: &Path) -> std::process::Child {
    Command::new(envoy)
        .arg("-c")
        .arg(config)
        .args(["--disable-hot-restart", "-l", "error", "--concurrency", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Envoy starts")
}

/// A process's CPU time so far (user and system), from /proc/<pid>/stat.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 =
        rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse::<u64>().ok()).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// One wait of the hook of `seconds` (`run --drain none --min-drain <seconds - 1>s --deadline
/// <seconds>s --verbose` and `extra`): Envoy's CPU share over it (when there is an Envoy), the
/// hook's CPU and peak RSS, how many counts it made, and its last count line.
struct Wait {
    envoy_share: Option<f64>,
    cpu: Duration,
    rss_kib: u64,
    /// Every count line's count, without the time left.
    counts: Vec<String>,
}

impl Wait {
    /// `counts (right)`: how many counts, and how many of them said `right`.
    fn counts(&self, right: &str) -> String {
        let good = self.counts.iter().filter(|c| c.starts_with(right)).count();
        format!("{} ({good} right)", self.counts.len())
    }

    fn last(&self) -> &str {
        self.counts.last().map_or("", String::as_str)
    }
}

fn quiet_wait(drain: &Path, envoy_pid: Option<u32>, seconds: u64, extra: &[&str]) -> Wait {
    let before = envoy_pid.map(cpu_of);
    let started = Instant::now();
    let (min_drain, deadline) = (format!("{}s", seconds - 1), format!("{seconds}s"));
    let args = ["--drain", "none", "--min-drain", &min_drain, "--deadline", &deadline, "--verbose"];
    let (lines, rss_kib, cpu) = watched_run(drain, &[&args[..], extra].concat());
    let wall = started.elapsed();
    let counts: Vec<String> = lines
        .iter()
        .filter_map(|l| l.split('\t').nth(3))
        .filter(|m| m.starts_with(|c: char| c.is_ascii_digit()) || m.starts_with("cannot count"))
        .map(|m| m.split(';').next().unwrap_or_default().to_string())
        .collect();
    Wait {
        envoy_share: envoy_pid
            .zip(before)
            .map(|(pid, b)| (cpu_of(pid) - b).as_secs_f64() / wall.as_secs_f64()),
        cpu,
        rss_kib,
        counts,
    }
}

/// The median wall time of `status` with `args`, over `trials`, and its last line.
fn status_time(drain: &Path, args: &[&str], trials: usize) -> (Duration, String) {
    let mut times = Vec::new();
    let mut said = String::new();
    for _ in 0..trials {
        let started = Instant::now();
        let out = Command::new(drain).arg("status").args(args).output().expect("envoy-drain runs");
        times.push(started.elapsed());
        said = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    }
    (median(times), said)
}

/// Section 9: the biggest sidecars and gateways: /clusters at 1,000 to 50,000 clusters, the
/// socket table at 10,000 and 100,000 connections, /stats at 10,000 listeners.
fn scale(drain: &Path, envoy: &Path) -> String {
    let dir = std::env::temp_dir().join(format!("envoy-drain-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut out = String::from(
        "## 9. Scale: the biggest sidecars and gateways\n\n\
         Each row is one hook waiting 10 s (`run --drain none --min-drain 9s --deadline 10s --verbose`, default \
         500 ms interval): Envoy's CPU share over the wait (from `/proc/<pid>/stat`), the hook's own CPU and peak RSS \
         (VmHWM), how many counts it made and how many of them were right, and its last count. One count is the median wall time of `status` with the \
         same flags. Nothing is in flight: the right count is 0 requests from /clusters (not unknown, not a fallback), \
         the number of connections held, and 0 connections at 10,000 listeners. For /clusters, the same wait over 60 s \
         (`--min-drain 59s --deadline 60s`) too, Envoy's CPU for one answer (the mean of three, read whole), and \
         Envoy's own share over 10 s with nothing asking.\n\n\
         ### `--count requests` from /clusters (Istio's default stats matcher, clusters of 3 hosts)\n\n\
         | clusters | /clusters answer | Envoy's answer (read whole) | Envoy's CPU per answer | one count | Envoy's CPU, idle | Envoy's CPU over 10 s | counts (right) | Envoy's CPU over 60 s | counts (right) | hook CPU (10 s) | hook peak RSS | last count |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for n in [1_000, 10_000, 50_000] {
        out += &clusters_row(drain, envoy, &dir, n);
    }
    out += "\nThe answer holds every cluster and host (about 1.8 KB a host), built whole on Envoy's main thread \
            before its first byte. The hook reads it line by line as it arrives, keeping three counters a host, so \
            memory stays flat at any size, and gives it time up to the deadline rather than a byte cap. The time between \
            counts grows with what a count cost (its CPU, the hook's and Envoy's main thread's; 20 times it, so counting keeps Envoy's main thread and the proxy \
            container's CPU at most 5% busy), with a count that ends when the min-drain ends, or one last count where it can still \
            end before the deadline.\n\n\
            ### Connections from the socket table (netlink)\n\n\
            | connections | sockets in the namespace | one count | hook CPU | hook peak RSS | counts (right) | last count |\n\
            |---:|---:|---:|---:|---:|---:|---|\n";
    out += &sockets_rows(drain);
    out += &listeners_row(drain, envoy, &dir, 10_000);
    out += HOLD_HEADER;
    out += &hold_row(drain, envoy, &dir, 10_000);
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// A row of `scale`'s /clusters table: an Envoy with `n` clusters of 3 hosts.
fn clusters_row(drain: &Path, envoy: &Path, dir: &Path, n: usize) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut child = clusters_envoy(envoy, dir, n, false);
    let live = support::envoy::until(Duration::from_secs(300), support::envoy::live);
    if !live {
        let _ = child.kill();
        let _ = child.wait();
        return format!("| {n} | Envoy did not come up within 300 s |||||||\n");
    }
    let mut bytes = 0;
    let mut answers = Vec::new();
    let cpu_before = cpu_of(child.id());
    for _ in 0..3 {
        let started = Instant::now();
        bytes = Conn::open(support::envoy::ADMIN)
            .and_then(|mut c| c.get("/clusters"))
            .map(|r| r.body.len())
            .unwrap_or_default();
        answers.push(started.elapsed());
    }
    let per_answer = (cpu_of(child.id()) - cpu_before) / 3;
    // What Envoy spends with nobody asking (stats flushes, timers), over as long.
    let idle_before = cpu_of(child.id());
    std::thread::sleep(Duration::from_secs(10));
    let idle = (cpu_of(child.id()) - idle_before).as_secs_f64() / 10.0;
    let (one, _) = status_time(drain, &["--count", "requests", "--source", "stats"], 3);
    let w = quiet_wait(drain, Some(child.id()), 10, &["--count", "requests"]);
    let long = quiet_wait(drain, Some(child.id()), 60, &["--count", "requests"]);
    let row = format!(
        "| {n} | {bytes} bytes | {:.0} ms | {:.0} ms | {:.0} ms | {:.1}% | {:.1}% | {} | {:.1}% | {} | {:.0} ms | {:.2} MiB | `{}` |\n",
        ms(median(answers)),
        ms(per_answer),
        ms(one),
        idle * 100.0,
        w.envoy_share.unwrap_or_default() * 100.0,
        w.counts("0 active requests (clusters)"),
        long.envoy_share.unwrap_or_default() * 100.0,
        long.counts("0 active requests (clusters)"),
        ms(w.cpu),
        w.rss_kib.max(long.rss_kib) as f64 / 1024.0,
        w.last(),
    );
    let _ = child.kill();
    let _ = child.wait();
    row
}

/// `scale`'s socket-table rows: 10,000 and 100,000 connections held open.
fn sockets_rows(drain: &Path) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut out = String::new();
    let mut held = Vec::new();
    let mut open = 0;
    for n in [10_000, 100_000] {
        if let Err(why) = holders(n - open, &mut held) {
            out += &format!("\nNot measured at {n} connections: {why}.\n");
            break;
        }
        open = n;
        let (one, _) = status_time(drain, &["--source", "proc"], 5);
        let w = quiet_wait(drain, None, 10, &["--source", "proc"]);
        out += &format!(
            "| {n} | {} | {:.0} ms | {:.0} ms | {:.2} MiB | {} | `{}` |\n",
            2 * n,
            ms(one),
            ms(w.cpu),
            w.rss_kib as f64 / 1024.0,
            w.counts(&format!("{n} active connections (proc)")),
            w.last(),
        );
    }
    for mut child in held {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    out
}

const HOLD_HEADER: &str = "\n### `hold` on a large sidecar (a request every 100 ms for 45 s, then none)\n\n\
    | clusters | Envoy's CPU, the load alone (10 s) | Envoy's CPU over the hold | reads | hold end after the last request | summary |\n\
    |---:|---:|---:|---:|---:|---|\n";

/// `hold` on a sidecar with `n` clusters: a request every 100 ms through the inbound listener
/// for 45 s, then none; Envoy's CPU share over the hold against the same load with nobody
/// reading, the reads the hold made, and how long after the last request it returned.
fn hold_row(drain: &Path, envoy: &Path, dir: &Path, n: usize) -> String {
    let _app = support::app::App::start("127.0.0.1:8080", false);
    let mut child = clusters_envoy(envoy, dir, n, true);
    let live = support::envoy::until(Duration::from_secs(300), support::envoy::live);
    // The client outside the pod, as the hold counts only those.
    let outside = support::netns::outside();
    let inbound = format!("{}:15006", support::netns::POD_SIDE);
    let open = || outside.enter(|| Conn::open(&inbound).ok());
    let mut conn = open();
    // Requests every 100 ms for `length`; when the last one was sent.
    let mut load = |length: Duration| {
        let started = Instant::now();
        let mut last = started;
        while started.elapsed() < length {
            last = Instant::now();
            let answered = conn.as_mut().is_some_and(|c| c.get("/work").is_ok());
            if !answered {
                conn = open();
            }
            thread::sleep(Duration::from_millis(100));
        }
        last
    };
    let row = match live {
        true => hold_measured(drain, child.id(), n, &mut load),
        false => format!("| {n} | Envoy did not come up within 300 s |||||\n"),
    };
    let _ = child.kill();
    let _ = child.wait();
    row
}

/// `hold_row`'s figures, Envoy (pid `envoy`) up: its CPU share under `load` alone for 10 s, then
/// over a hold while `load` runs 45 s.
fn hold_measured(
    drain: &Path,
    envoy: u32,
    n: usize,
    load: &mut dyn FnMut(Duration) -> Instant,
) -> String {
    let before = cpu_of(envoy);
    let started = Instant::now();
    load(Duration::from_secs(10));
    let alone = (cpu_of(envoy) - before).as_secs_f64() / started.elapsed().as_secs_f64();
    let before = cpu_of(envoy);
    let started = Instant::now();
    let hook = Command::new(drain)
        .args(["hold", "--min", "0s", "--deadline", "60s", "--verbose"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("envoy-drain starts");
    let waited = thread::spawn(move || (hook.wait_with_output(), Instant::now()));
    let last = load(Duration::from_secs(45));
    let (out, returned) = waited.join().expect("the waiting thread");
    let out = out.expect("the hold ends");
    let ended = Instant::now();
    let share = (cpu_of(envoy) - before).as_secs_f64() / (ended - started).as_secs_f64();
    let log = String::from_utf8_lossy(&out.stderr);
    let messages: Vec<&str> = log.lines().filter_map(|l| l.split('\t').nth(3)).collect();
    let reads = messages.iter().filter(|m| m.starts_with(|c: char| c.is_ascii_digit())).count();
    format!(
        "| {n} | {:.1}% | {:.1}% | {reads} | {:.1} s | `{}` |\n",
        alone * 100.0,
        share * 100.0,
        // Negative: it returned while requests still arrived.
        returned.duration_since(last).as_secs_f64() - last.duration_since(returned).as_secs_f64(),
        messages.last().unwrap_or(&""),
    )
}

/// Envoy with `n` listeners, each of which has had a connection, and the connection stats on:
/// `/stats` lists two lines a listener.
fn listeners_row(drain: &Path, envoy: &Path, dir: &Path, n: usize) -> String {
    let mut yaml = String::from(
        "admin:\n  address: { socket_address: { address: 127.0.0.1, port_value: 15000 } }\n\
         stats_config:\n  stats_matcher:\n    inclusion_list:\n      patterns:\n      - suffix: \"downstream_cx_active\"\n\
         static_resources:\n  listeners:\n",
    );
    for i in 0..n {
        yaml += &format!(
            "  - name: l{i}\n    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }}\n    \
             filter_chains:\n    - filters:\n      - name: envoy.filters.network.http_connection_manager\n        \
             typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          \
             stat_prefix: l{i}\n          route_config: {{}}\n          http_filters:\n          - name: envoy.filters.http.router\n            \
             typed_config: {{ \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}\n",
            20_000 + i
        );
    }
    let config = dir.join("listeners.yaml");
    std::fs::write(&config, yaml).expect("the config");
    // One worker: Envoy holds a socket per listener and worker, and this machine's hard limit on
    // open files is 20,000.
    let mut child = Command::new(envoy)
        .arg("-c")
        .arg(&config)
        .args(["--disable-hot-restart", "-l", "error", "--concurrency", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Envoy starts");
    let header = "\n### `/stats` at 10,000 listeners (connection stats on, as `EXIT_ON_ZERO_ACTIVE_CONNECTIONS` sets them)\n\n\
                  | listeners | /stats answer | one count | Envoy's CPU over the wait | hook CPU | hook peak RSS | counts (right) | last count |\n\
                  |---:|---:|---:|---:|---:|---:|---:|---|\n";
    let ready = support::envoy::until(Duration::from_secs(300), || {
        TcpStream::connect(("127.0.0.1", (20_000 + n - 1) as u16)).is_ok()
    });
    // A connection to every listener, closed again: `usedonly` lists a listener once it has had one.
    let opened =
        (0..n).filter(|i| TcpStream::connect(("127.0.0.1", (20_000 + i) as u16)).is_ok()).count();
    let row = if ready {
        let bytes = Conn::open(support::envoy::ADMIN)
            .and_then(|mut c| c.get("/stats?usedonly&filter=downstream_cx_active$"))
            .map(|r| r.body.len())
            .unwrap_or_default();
        let (one, _) = status_time(drain, &["--source", "stats"], 5);
        let w = quiet_wait(drain, Some(child.id()), 10, &["--source", "stats"]);
        format!(
            "| {n} ({opened} had a connection) | {bytes} bytes | {:.0} ms | {:.1}% | {:.0} ms | {:.2} MiB | {} | `{}` |\n",
            (one.as_secs_f64() * 1000.0),
            w.envoy_share.unwrap_or_default() * 100.0,
            w.cpu.as_secs_f64() * 1000.0,
            w.rss_kib as f64 / 1024.0,
            w.counts("0 active connections (stats)"),
            w.last(),
        )
    } else {
        format!("| {n} | Envoy's listeners did not come up within 300 s |||||||\n")
    };
    let _ = child.kill();
    let _ = child.wait();
    format!("{header}{row}")
}
