//! A flood of half-open connections (connected; silent, or part of a request head) on a
//! listener with the binary's limit of 64: a health probe is still answered promptly
//! (see `PROBE_DEADLINE`), again and again while the flood arrives (150 connections every 250 ms), and the
//! server never holds more than its limit (plus the connection it just accepted).
//!
//! A flood that reconnects as fast as the server closes it is another attack, on the
//! CPU: a probe then waits behind every queued connection, at the rate the server
//! accepts and closes them (see BENCHMARKS.md, "HTTP connection flood").
//!
//! The server is a process of its own (this test binary, run as `flood_server_process`),
//! so its descriptors and memory are counted apart from the flood's; the flood and the
//! probe run on threads of their own, so a probe's time is the server's doing.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use freshen_http::ListenerConfig;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The binary's limit on its `/healthz` listener (`[http] max_connections`'s default).
const LIMIT: usize = 64;
/// How many connections the flood opens, at most.
const FLOOD: usize = 3000;
/// In this many bursts, one every `FLOOD_EVERY`: the flood lasts as long as the probes.
const BURSTS: usize = 20;
const FLOOD_EVERY: Duration = Duration::from_millis(250);
/// How long a probe may take here. An orchestrator's usual probe timeout is a second,
/// and the probes take milliseconds (BENCHMARKS.md, *HTTP connection flood*, measures
/// them); but on two cores kept busy by other builds and stress loops the slowest took
/// 952 ms, so a one-second bound made this test fail for the machine's load, not for the
/// server. Two seconds is twice that, and still well below what the faults it guards
/// against cost: a probe waiting for a place freed by a header timeout (10 s), or for the
/// kernel to retry a SYN dropped by a full listen queue (2–3 s measured).
const PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// `Max open files` (soft) of this process.
fn fd_soft_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits (Linux)");
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .expect("a soft limit on open files")
}

/// Tells the test binary to be the flood's server: the value is its connection limit.
const SERVER_ENV: &str = "FRESHEN_HTTP_FLOOD_SERVER";

/// Not a test of its own: with `FRESHEN_HTTP_FLOOD_SERVER=LIMIT` it serves the test
/// routes on a loopback port (bound by [`freshen_http::bind`]), prints `listening ADDR`
/// and serves until its standard input closes.
#[test]
#[ignore = "the server process of the flood tests, which run it themselves"]
fn flood_server_process() {
    let Some(limit) = std::env::var(SERVER_ENV).ok() else {
        return;
    };
    let mut settings = ListenerConfig::new("metrics");
    settings.max_connections = limit.parse().expect("a limit");
    // The default: the flood is not cut by it during the test.
    settings.header_timeout = Duration::from_secs(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = freshen_http::bind(([127, 0, 0, 1], 0).into()).expect("bind");
        println!("listening {}", listener.local_addr().unwrap());
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        });
        freshen_http::serve(listener, router(), settings, async {
            let _ = stdin_closed.await;
        })
        .await
        .expect("serve");
    });
}

/// The server process, killed if the test fails before closing its input.
struct ServerProcess {
    child: Child,
    addr: std::net::SocketAddr,
}

impl ServerProcess {
    fn start(limit: usize) -> ServerProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "serve_flood::flood_server_process",
                "--ignored",
                "--nocapture",
            ])
            .env(SERVER_ENV, limit.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server process");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = out
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("listening ").map(|a| a.parse().unwrap()))
            .expect("the server process says where it listens");
        // The rest is the harness's report: read, so its writes do not fail.
        std::thread::spawn(move || out.for_each(drop));
        ServerProcess { child, addr }
    }

    fn pid(&self) -> ServerPid {
        ServerPid(self.child.id())
    }

    /// Closes its input and waits for it to stop.
    fn stop(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("wait for the server process");
        assert!(status.success(), "the server process: {status}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if self.child.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A process's descriptors and memory, by its id (0 once it is gone).
struct ServerPid(u32);

impl ServerPid {
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.0)).map_or(0, |d| d.count())
    }

    fn rss_kib(&self) -> usize {
        std::fs::read_to_string(format!("/proc/{}/status", self.0))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    }
}

/// One probe: connect, ask for `/hello`, read the status line. Its time, and the status.
async fn probe(addr: std::net::SocketAddr) -> (Duration, String) {
    let start = Instant::now();
    let answer = tokio::time::timeout(PATIENCE, async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(get_req("/hello", "127.0.0.1", "").as_bytes())
            .await
            .expect("write");
        let mut head = [0u8; 12];
        s.read_exact(&mut head).await.expect("a status line");
        String::from_utf8_lossy(&head).into_owned()
    })
    .await
    .expect("the probe is answered at all");
    (start.elapsed(), answer)
}

#[test]
fn health_probes_are_answered_promptly_under_a_flood_of_half_open_connections() {
    // Every flood connection holds one client descriptor; the server at most LIMIT + 1.
    let flood = FLOOD.min(fd_soft_limit().saturating_sub(LIMIT + 256));
    assert!(
        flood >= 1000,
        "`ulimit -n` leaves room for {flood} connections only"
    );
    let server = ServerProcess::start(LIMIT);
    let addr = server.addr;
    let idle_fds = server.pid().fds();
    let idle_rss = server.pid().rss_kib();

    // The flood: a burst of connections every 250 ms, beside the probes, each sending
    // nothing (even) or part of a request head (odd) and holding its connection until
    // the server closes it or the test ends.
    let stop = Arc::new(AtomicBool::new(false));
    let closed_by_server = Arc::new(AtomicUsize::new(0));
    let flooder = {
        let (stop, closed_by_server) = (stop.clone(), closed_by_server.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut tasks = Vec::new();
                let mut pace = tokio::time::interval(FLOOD_EVERY);
                for i in 0..flood {
                    if i % (flood / BURSTS) == 0 {
                        pace.tick().await;
                    }
                    let (stop, closed_by_server) = (stop.clone(), closed_by_server.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut s = tokio::time::timeout(PATIENCE, TcpStream::connect(addr))
                            .await
                            .expect("the listen queue takes the flood")
                            .expect("connect");
                        if i % 2 == 1 {
                            let _ = s.write_all(b"GET /hello HTTP/1.1\r\nX-Slow: ").await;
                        }
                        let mut buf = [0u8; 64];
                        // Polled until the server closes it or the test ends.
                        loop {
                            match tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf))
                                .await
                            {
                                Ok(Ok(0) | Err(_)) => {
                                    closed_by_server.fetch_add(1, Ordering::Relaxed);
                                    break;
                                }
                                Ok(Ok(_)) => panic!("a half-open connection was answered"),
                                Err(_) if stop.load(Ordering::Relaxed) => break,
                                Err(_) => {}
                            }
                        }
                    }));
                }
                for t in tasks {
                    t.await.expect("a flood task");
                }
            });
        })
    };

    // A sampler watches the server's descriptors and memory throughout.
    let sampling = Arc::new(AtomicBool::new(true));
    let pid = server.pid();
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let (mut most_fds, mut most_rss, mut samples) = (0usize, 0usize, 0usize);
            while sampling.load(Ordering::Relaxed) {
                most_fds = most_fds.max(pid.fds());
                most_rss = most_rss.max(pid.rss_kib());
                samples += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            (most_fds, most_rss, samples)
        })
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (times, closed_during) = rt.block_on(async {
        eventually("the first burst fills the server's places", || {
            server.pid().fds() >= idle_fds + LIMIT
        })
        .await;
        let mut times = Vec::new();
        let mut pace = tokio::time::interval(FLOOD_EVERY);
        for _ in 0..BURSTS {
            pace.tick().await;
            let (took, answer) = probe(addr).await;
            assert_eq!(answer, "HTTP/1.1 200", "probe {} answered", times.len());
            times.push(took);
        }
        let closed_during = closed_by_server.load(Ordering::Relaxed);
        // Every flood connection reached the server, which holds a limit's worth at most.
        eventually("the server takes every flood connection", || {
            closed_by_server.load(Ordering::Relaxed) >= flood - LIMIT
        })
        .await;
        (times, closed_during)
    });
    stop.store(true, Ordering::Relaxed);
    flooder.join().expect("the flood");
    sampling.store(false, Ordering::Relaxed);
    let (most_fds, most_rss, samples) = sampler.join().unwrap();
    server.stop();

    let slowest = times.iter().max().copied().unwrap();
    eprintln!(
        "flood of {flood}: probes {times:?}; {closed_during} flood connections closed by the server \
         during the probes; server: {idle_fds} descriptors and {idle_rss} KiB idle, at most \
         {most_fds} and {most_rss} KiB ({samples} samples)"
    );
    assert!(
        slowest < PROBE_DEADLINE,
        "every probe within {PROBE_DEADLINE:?}: {times:?}"
    );
    // The flood lasted the whole probing: most of it arrived while probes ran.
    assert!(
        closed_during >= flood / 2,
        "{closed_during} flood connections closed by the server during the probes"
    );
    // The bound: the limit, plus the one connection accepted before a place is made;
    // reached, so the flood did fill it.
    assert!(
        (idle_fds + LIMIT..=idle_fds + LIMIT + 1).contains(&most_fds),
        "the server held at most {most_fds} descriptors, {idle_fds} idle (limit {LIMIT})"
    );
}

/// What one held connection costs the server: its memory growth holding 2000
/// connections (half silent, half with part of a request head read into hyper's
/// buffer), over 2000. A measurement for BENCHMARKS.md, not a check: run with
/// `cargo nextest run -p freshen-http --test it --run-ignored only --no-capture -- per_connection_cost`.
#[test]
#[ignore = "a measurement; prints its figure"]
fn per_connection_cost() {
    const HELD: usize = 2000;
    let server = ServerProcess::start(HELD + 1);
    let addr = server.addr;
    let (idle_fds, idle_rss) = (server.pid().fds(), server.pid().rss_kib());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut held = Vec::new();
        for i in 0..HELD {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            if i % 2 == 1 {
                s.write_all(b"GET /hello HTTP/1.1\r\nX-Slow: ")
                    .await
                    .unwrap();
            }
            held.push(s);
        }
        eventually("the server holds every connection", || {
            server.pid().fds() >= idle_fds + HELD
        })
        .await;
        let rss = server.pid().rss_kib();
        eprintln!(
            "per connection: {:.1} KiB of server memory ({HELD} held: {idle_rss} KiB idle, {rss} KiB held)",
            (rss - idle_rss) as f64 / HELD as f64
        );
    });
    server.stop();
}
