//! `hold` under random arrivals, on a fake clock (BENCHMARKS §13): the project's own wait
//! (src/wait.rs) fed as the socket table feeds it. Requests come at random (Poisson) at a rate,
//! from long before the deletion until the propagation P after it (when the last client learns
//! that the pod is gone); each is seen by the first read after it. The pod closes first (its
//! connections wait in TIME_WAIT in the pod, which the first read remembers), the client closes
//! first (no memory: the namespace's `PassiveOpens` alone counts them), or ambient mode
//! (ztunnel's hop to the app: an end in the pod waits in TIME_WAIT whichever side closed). A
//! deletion loses a request when one arrives after the hold returned and before P. Prints, per
//! rate and P, the share of deletions that lost one, and the mean and 95th percentile of the
//! hold's end, beside `sleep 15`. Figures, never asserted.
//!
//! `cargo run --release --example simulate -- [deletions=20000] [seed=1] [rates=0.1,...]
//! [p=2,5,10,15] [close=pod,client,ambient]`

use envoy_drain::cli::HoldArgs;
use envoy_drain::config::{Plan, Rules};
use envoy_drain::count::Cost;
use envoy_drain::hold::config::hold_config;
use envoy_drain::source::arrivals::{before, remember};
use envoy_drain::wait::{Sight, Step, Wait};
use std::time::Duration;

/// How long a read of the socket table takes (netlink, a small pod).
const READ: Duration = Duration::from_millis(1);

/// How long a request holds its connection: the app's answer.
const SERVICE: f64 = 0.010;

/// How far back the arrivals go one by one: TIME_WAIT's 60 s, and more.
const HISTORY: f64 = 120.0;

/// The pod's age at its deletion: the namespace's `PassiveOpens` count its arrivals since.
const AGE: f64 = 600.0;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Close {
    Pod,
    Client,
    Ambient,
}

/// splitmix64: a fixed seed gives the same table on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn gap(&mut self, rate: f64) -> f64 {
        -(1.0 - self.next()).ln() / rate
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// One deletion: the arrivals' times (seconds, the deletion at 0), the hold's end and how many
/// arrived after it.
fn deletion(rules: &Rules, arrivals: &[f64], older: u64, close: Close) -> (f64, usize) {
    let mut wait = Wait::new(rules, Duration::ZERO);
    let mut now = Duration::ZERO;
    let mut first = true;
    for _ in 0..100_000 {
        match wait.next(now) {
            Step::Sleep(until) => now = until,
            Step::Look(ask) => {
                let t = secs(now);
                let seen = arrivals.partition_point(|&a| a <= t) as u64;
                // The first read remembers the connections closed in the pod (TIME_WAIT, 60 s).
                let memory = (first && close != Close::Client).then(|| {
                    let closed = arrivals.iter().filter(|&&a| a + SERVICE <= t && t - a < 60.0);
                    before(closed.map(|a| Duration::from_secs_f64(t - a - SERVICE)).collect())
                });
                let life = (older + seen, Duration::from_secs_f64(AGE + t));
                let closing = memory.as_ref().is_some_and(Option::is_some);
                let ambient = close == Close::Ambient;
                let remembered =
                    first.then(|| remember(memory.flatten(), closing, Some(life), ambient));
                first = false;
                // Where the pod keeps a socket of each, the newest's tells when it came (the time
                // since it last received, or since it closed); else it came at some time since
                // the read before.
                let newest = (close != Close::Client)
                    .then(|| arrivals[..seen as usize].last())
                    .flatten()
                    .map(|&a| {
                        Duration::from_secs_f64(if a + SERVICE <= t {
                            t - a - SERVICE
                        } else {
                            t - a
                        })
                    });
                let sight = Sight {
                    count: Some(0),
                    arrivals: Some(seen),
                    opened: Some(seen),
                    before: remembered.flatten(),
                    newest: Some(newest.unwrap_or_default()),
                    cost: Cost { look: READ, ..Cost::default() },
                    ..Sight::default()
                };
                let started = now;
                now += READ;
                wait.saw(ask, (started, now), &sight);
            }
            Step::End(_) => {
                let end = secs(now);
                let lost = arrivals.iter().filter(|&&a| a > end).count();
                return (end, lost);
            }
        }
    }
    unreachable!("a wait ends by its deadline")
}

/// A cell's closest deletion: its loss, how clients close, the rate, P, and `Cell::closest`.
type Hardest = (f64, Close, f64, f64, (f64, f64, Vec<f64>));

/// For live replays (tests/pod.rs reads them from tests/pod/schedules.txt): for each way
/// clients close, in the cell that lost most, the schedule whose hold the arrivals' rate (not
/// the propagation) ended closest after its last request (0.3 s or more). A line each: how
/// clients close, the rate, P, the hold's end (ms) and the arrivals (ms from the deletion,
/// from a minute before it: the kernel's memory).
fn print_hardest(mut hardest: Vec<Hardest>) {
    hardest.retain(|h| !h.4.2.is_empty());
    hardest.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!("\nThe hardest schedules (for each way clients close, the cell that lost most):");
    let mut told = Vec::new();
    for (lost, close, rate, p, (margin, end, arrivals)) in &hardest {
        if told.contains(close) {
            continue;
        }
        told.push(*close);
        let ms: Vec<String> = (arrivals.iter())
            .filter(|&&a| a > -60.0)
            .map(|a| format!("{}", (a * 1000.0).round() as i64))
            .collect();
        println!(
            "- {close:?} closes first, {rate}/s, P = {p} s ({lost:.2} % lost): {margin:.3} s after"
        );
        let end = (end * 1000.0).round();
        println!("  {close:?} {rate} {p} {end} {}", ms.join(","));
    }
}

struct Cell {
    lost: f64,
    mean: f64,
    p95: f64,
    /// The deletion whose hold its arrivals' rate ended closest after its last request, at least
    /// 0.3 s after it: how far after (seconds), its end, and its arrivals.
    closest: (f64, f64, Vec<f64>),
}

/// The propagation of `hold`'s rules (`hold_config` makes no other plan).
fn propagation(rules: &Rules) -> Duration {
    let Plan::Hold(hold) = &rules.plan else { panic!("not a hold's rules: {rules:?}") };
    hold.propagation
}

fn cell(rules: &Rules, rate: f64, p: f64, close: Close, n: usize, rng: &mut Rng) -> Cell {
    let (mut losing, mut ends) = (0, Vec::with_capacity(n));
    let mut closest = (f64::MAX, 0.0, Vec::new());
    for _ in 0..n {
        let mut arrivals = Vec::new();
        let mut t = -HISTORY + rng.gap(rate);
        while t <= p {
            arrivals.push(t);
            t += rng.gap(rate);
        }
        let older = poisson(rng, rate * (AGE - HISTORY));
        let (end, lost) = deletion(rules, &arrivals, older, close);
        losing += usize::from(lost > 0);
        ends.push(end);
        let margin = end - arrivals.iter().copied().filter(|&a| a > 0.0).fold(0.0, f64::max);
        // Where the rate ended the hold, not the propagation; a live replay tells an end from
        // the last request 0.3 s apart, not much closer.
        let by_rate = end < secs(propagation(rules)) - 0.1;
        if lost == 0 && by_rate && margin >= 0.3 && margin < closest.0 {
            closest = (margin, end, arrivals);
        }
    }
    ends.sort_by(f64::total_cmp);
    Cell {
        lost: 100.0 * losing as f64 / n as f64,
        mean: ends.iter().sum::<f64>() / n as f64,
        p95: ends[(n * 95 / 100).min(n - 1)],
        closest,
    }
}

/// A Poisson count of mean `mean`: by its gaps while small, else by the normal law.
fn poisson(rng: &mut Rng, mean: f64) -> u64 {
    if mean > 50.0 {
        let (u, v) = (1.0 - rng.next(), rng.next());
        let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
        return (mean + z * mean.sqrt()).round().max(0.0) as u64;
    }
    let (mut n, mut t) = (0, rng.gap(1.0));
    while t < mean {
        n += 1;
        t += rng.gap(1.0);
    }
    n
}

fn list(v: &str) -> Vec<f64> {
    v.split(',').map(|x| x.parse().expect("a number")).collect()
}

fn main() {
    let (mut n, mut seed) = (20_000, 1);
    let mut rates = vec![0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 20.0, 100.0];
    let mut props = vec![2.0, 5.0, 10.0, 15.0];
    let mut closes = vec![Close::Pod, Close::Client, Close::Ambient];
    for arg in std::env::args().skip(1) {
        match arg.split_once('=') {
            Some(("deletions", v)) => n = v.parse().expect("a number of deletions"),
            Some(("seed", v)) => seed = v.parse().expect("a seed"),
            Some(("rates", v)) => rates = list(v),
            Some(("p", v)) => props = list(v),
            Some(("close", v)) => {
                closes = (v.split(','))
                    .map(|c| match c {
                        "pod" => Close::Pod,
                        "client" => Close::Client,
                        "ambient" => Close::Ambient,
                        _ => panic!("close= takes pod, client or ambient"),
                    })
                    .collect()
            }
            _ => panic!("unknown argument {arg}"),
        }
    }
    // The hold's own defaults, as `envoy-drain hold --preset none` takes them.
    let args = HoldArgs { preset: Some("none".into()), ..HoldArgs::default() };
    let rules = hold_config(&args, &|_| None).expect("the defaults parse").rules;
    println!(
        "hold's defaults: --min {:?}, --quiet {:?}, --propagation {:?}, --deadline {:?}, --interval {:?}",
        rules.min_drain,
        rules.settle,
        propagation(&rules),
        rules.deadline,
        rules.interval
    );
    let mut rng = Rng(seed);
    let mut hardest = Vec::new();
    for close in closes {
        println!(
            "\n{close:?} closes first, {n} deletions a cell: lost (share of deletions), mean end, p95 end\n"
        );
        let head: Vec<String> = props.iter().map(|p| format!("P = {p} s")).collect();
        println!("| rate /s | {} | `sleep 15` |", head.join(" | "));
        println!("|---|{}---|", "---|".repeat(props.len()));
        for &rate in &rates {
            let cells: Vec<String> = (props.iter())
                .map(|&p| {
                    let c = cell(&rules, rate, p, close, n, &mut rng);
                    hardest.push((c.lost, close, rate, p, c.closest.clone()));
                    format!("{:.2} % · {:.3} s · {:.1} s", c.lost, c.mean, c.p95)
                })
                .collect();
            println!("| {rate} | {} | 0 % · 15.0 s |", cells.join(" | "));
        }
    }
    print_hardest(hardest);
}
