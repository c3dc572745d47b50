//! The slow application behind Envoy: `GET /delay/<seconds>` answers after that long. It tells the
//! test when each request arrives and when each response was written.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub enum Event {
    Received(String),
    Answered(String, Instant),
}

pub struct App {
    addr: String,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    events: Receiver<Event>,
    accept: Option<thread::JoinHandle<()>>,
}

impl App {
    /// Listens on `addr`. With `close_after_response` every response says `connection: close` and
    /// the connection ends, as an application that is shutting down does.
    pub fn start(addr: &str, close_after_response: bool) -> App {
        let listener = TcpListener::bind(addr).expect("the app's port is free");
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (tx, events) = channel();
        let accept = {
            let (stop, conns) = (Arc::clone(&stop), Arc::clone(&conns));
            thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    if let Ok(clone) = stream.try_clone() {
                        conns.lock().unwrap().push(clone);
                    }
                    let tx = tx.clone();
                    thread::spawn(move || serve(stream, tx, close_after_response));
                }
            })
        };
        App { addr: addr.to_string(), stop, conns, events, accept: Some(accept) }
    }

    /// Waits until `n` requests have arrived; fails the test after `limit`.
    pub fn wait_received(&self, n: usize, limit: Duration) {
        let until = Instant::now() + limit;
        let mut seen = 0;
        while seen < n {
            let left = until.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Received(_)) => seen += 1,
                Ok(Event::Answered(..)) => {}
                Err(_) => panic!("the app got {seen} of {n} requests within {limit:?}"),
            }
        }
    }

    /// Waits for the next response the app writes and returns when it was written.
    pub fn wait_answered(&self, limit: Duration) -> Instant {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Answered(_, at)) => return at,
                Ok(Event::Received(_)) => {}
                Err(_) => panic!("the app answered nothing within {limit:?}"),
            }
        }
    }
}

fn serve(stream: TcpStream, tx: Sender<Event>, close_after_response: bool) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request).unwrap_or(0) == 0 {
            return;
        }
        let mut header = String::new();
        while reader.read_line(&mut header).unwrap_or(0) > 2 {
            header.clear();
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
        let _ = tx.send(Event::Received(path.clone()));
        let delay = path.strip_prefix("/delay/").and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
        thread::sleep(Duration::from_secs_f64(delay.clamp(0.0, 30.0)));
        let body = format!("slept {delay}s\n");
        let close = if close_after_response { "Connection: close\r\n" } else { "" };
        let written = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{close}\r\n{body}",
            body.len()
        );
        let _ = tx.send(Event::Answered(path, Instant::now()));
        if written.is_err() || close_after_response {
            let _ = out.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}
