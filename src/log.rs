//! One line per event, shaped like pilot-agent's own lines so they sit naturally in
//! `kubectl logs -c istio-proxy`: `<RFC 3339 UTC, microseconds>\t<level>\tenvoy-drain\t<message>`.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

pub struct Logger {
    out: Box<dyn Write + Send>,
    file: Option<File>,
    /// stderr is a terminal: waiting messages redraw one line instead of adding lines.
    live: bool,
    /// The live line on screen, redrawn after any other line.
    shown: Option<String>,
    warned: Vec<String>,
}

/// Formats one line. Control characters (a hostile admin body can hold any) become spaces so an
/// event is always exactly one line.
pub fn format_line(time: SystemTime, level: Level, message: &str) -> String {
    let clean: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!(
        "{}\t{}\tenvoy-drain\t{clean}\n",
        humantime::format_rfc3339_micros(time),
        level.name()
    )
}

impl Logger {
    pub fn new(out: Box<dyn Write + Send>, live: bool) -> Logger {
        Logger {
            out,
            file: None,
            live,
            shown: None,
            warned: Vec::new(),
        }
    }

    /// Logs to stderr, live when it is a terminal.
    pub fn stderr() -> Logger {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        Logger::new(Box::new(std::io::stderr()), tty)
    }

    /// Also appends every line to `path`. A file that cannot be opened is a warning: the hook goes
    /// on without it.
    pub fn add_file(&mut self, path: &Path) {
        match std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
        {
            Ok(f) => self.file = Some(f),
            Err(e) => self.warn(&format!(
                "failed to open log file {}: {e}; logging to stderr only",
                path.display()
            )),
        }
    }

    pub fn info(&mut self, message: &str) {
        self.line(Level::Info, message);
    }

    pub fn warn(&mut self, message: &str) {
        self.line(Level::Warn, message);
    }

    /// Warns the first time a message is seen in this run; parsers repeat theirs at every count.
    pub fn warn_once(&mut self, message: &str) {
        if !self.warned.iter().any(|w| w == message) {
            self.warned.push(message.to_string());
            self.warn(message);
        }
    }

    /// Writes failures are ignored on purpose: a closed stderr or a full log pipe must not stop
    /// the hook from waiting.
    pub fn line(&mut self, level: Level, message: &str) {
        let text = format_line(SystemTime::now(), level, message);
        if let Some(f) = &mut self.file {
            let _ = f.write_all(text.as_bytes());
        }
        if self.live && self.shown.is_some() {
            let _ = self.out.write_all(b"\r\x1b[K");
        }
        let _ = self.out.write_all(text.as_bytes());
        if let Some(live) = &self.shown {
            let _ = write!(self.out, "{live}");
        }
        let _ = self.out.flush();
    }

    /// A waiting update. On a terminal it redraws the live line every time; elsewhere it becomes
    /// a log line only when `worth_a_line` (the count changed, or it has been a while).
    pub fn waiting(&mut self, message: &str, worth_a_line: bool) {
        if !self.live {
            if worth_a_line {
                self.info(message);
            }
            return;
        }
        if worth_a_line && let Some(f) = &mut self.file {
            let _ = f.write_all(format_line(SystemTime::now(), Level::Info, message).as_bytes());
        }
        // One terminal row, or `\r` cannot take the cursor back to its start.
        let text: String = format!("envoy-drain: {message}")
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(terminal_width().saturating_sub(1))
            .collect();
        let _ = write!(self.out, "\r\x1b[K{text}");
        let _ = self.out.flush();
        self.shown = Some(text);
    }

    /// Ends the live line so that the next line starts clean.
    pub fn end_live(&mut self) {
        if self.shown.take().is_some() {
            let _ = self.out.write_all(b"\r\x1b[K");
            let _ = self.out.flush();
        }
    }
}

/// A writer that keeps what the logger wrote, for tests of what a user would read.
fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize we own; on failure it stays zeroed.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) };
    match size.ws_col {
        0 => 80,
        cols => usize::from(cols),
    }
}

#[cfg(test)]
pub mod testing {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    pub struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        pub fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Sink;
    use super::*;
    use std::time::Duration;

    #[test]
    fn lines_have_pilot_agents_shape() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_795_310_348_123_456);
        assert_eq!(
            format_line(t, Level::Info, "draining"),
            "2026-11-22T01:19:08.123456Z\tinfo\tenvoy-drain\tdraining\n"
        );
    }

    #[test]
    fn a_message_is_always_one_line() {
        let t = SystemTime::UNIX_EPOCH;
        let l = format_line(t, Level::Warn, "bad\nbody\r\x1b[2Jhere\t");
        assert_eq!(l.matches('\n').count(), 1);
        assert!(
            l.ends_with("\twarn\tenvoy-drain\tbad body  [2Jhere \n"),
            "{l:?}"
        );
    }

    #[test]
    fn warn_once_says_a_thing_once() {
        let sink = Sink::default();
        let mut log = Logger::new(Box::new(sink.clone()), false);
        log.warn_once("gauge wrapped");
        log.warn_once("gauge wrapped");
        log.warn_once("other");
        assert_eq!(sink.text().lines().count(), 2);
    }

    #[test]
    fn waiting_updates_become_lines_only_when_worth_it_off_a_terminal() {
        let sink = Sink::default();
        let mut log = Logger::new(Box::new(sink.clone()), false);
        log.waiting("3 open", true);
        log.waiting("3 open", false);
        log.waiting("2 open", true);
        let text = sink.text();
        assert_eq!(text.lines().count(), 2);
        assert!(!text.contains('\r'));
    }

    #[test]
    fn on_a_terminal_waiting_redraws_one_line_and_other_lines_keep_it() {
        let sink = Sink::default();
        let mut log = Logger::new(Box::new(sink.clone()), true);
        log.waiting("3 open", true);
        log.waiting("2 open", false);
        log.warn("stats unavailable");
        log.end_live();
        log.info("done");
        let text = sink.text();
        assert_eq!(
            text.matches('\n').count(),
            2,
            "only the warning and the final line end in a newline: {text:?}"
        );
        assert!(text.contains("\r\x1b[K"));
        assert!(text.ends_with("\tinfo\tenvoy-drain\tdone\n"), "{text:?}");
    }

    #[test]
    fn a_log_file_that_cannot_be_opened_is_a_warning() {
        let sink = Sink::default();
        let mut log = Logger::new(Box::new(sink.clone()), false);
        log.add_file(Path::new("/nonexistent-dir/x.log"));
        log.info("still logging");
        let text = sink.text();
        assert!(
            text.contains("warn\tenvoy-drain\tfailed to open log file /nonexistent-dir/x.log"),
            "{text}"
        );
        assert!(text.contains("still logging"));
    }

    #[test]
    fn the_log_file_gets_every_line() {
        let dir = std::env::temp_dir().join(format!("envoy-drain-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hook.log");
        let _ = std::fs::remove_file(&path);
        let mut log = Logger::new(Box::new(Sink::default()), false);
        log.add_file(&path);
        log.info("one");
        log.waiting("two", true);
        log.waiting("not a line", false);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    }
}
