//! One line per event, shaped like pilot-agent's own: `<RFC 3339 UTC, microseconds>\t<level>\t
//! envoy-drain\t<message>`, or with `--log-format json` one JSON object a line, the summary's with
//! the termination's record (record.rs). Writing never blocks the hook: a line that cannot be written at once
//! is dropped and counted, and only the final summary waits a little for room.

use crate::error::{failed, io_cause};
use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Format {
    #[default]
    Text,
    /// `{"time":...,"level":...,"logger":"envoy-drain","msg":...}`, a line each.
    Json,
}

/// Warning lines kept for the record, at most, each cut to this many bytes: the record and the
/// summary's message share one line of `MAX_LINE`.
const KEPT_WARNINGS: usize = 16;
const KEPT_WARNING_BYTES: usize = 160;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Info,
    Warn,
    Error,
}

/// The longest line: a write of up to PIPE_BUF bytes to a pipe is whole or not at all.
const MAX_LINE: usize = 4096;

/// How long the final summary may wait for room in a full pipe.
const SUMMARY_WAIT: Duration = Duration::from_millis(100);

/// Where lines go: a writer, and its descriptor when it has one (for poll).
pub(crate) struct Out {
    writer: Box<dyn Write + Send>,
    fd: Option<RawFd>,
    /// The descriptor may block: ask poll for room before each write.
    poll_first: bool,
    /// Lines that could not be written at once.
    dropped: u64,
    /// Why a line could not be written, where it was not for want of room: a full disk, say.
    failed: Option<String>,
}

impl Out {
    pub(crate) fn new(writer: Box<dyn Write + Send>) -> Out {
        Out { writer, fd: None, poll_first: false, dropped: 0, failed: None }
    }

    /// A file opened with O_NONBLOCK, which poll can wait on.
    fn file(f: std::fs::File) -> Out {
        Out { fd: Some(f.as_raw_fd()), ..Out::new(Box::new(f)) }
    }

    /// stderr as a descriptor of its own with O_NONBLOCK (reopened through /proc, so the flag reaches
    /// no one else), else stderr itself, asking poll for room first.
    fn stderr() -> Out {
        let reopened = OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/proc/self/fd/2");
        match reopened {
            Ok(f) => Out::file(f),
            Err(_) => Out {
                fd: Some(libc::STDERR_FILENO),
                poll_first: true,
                ..Out::new(Box::new(std::io::stderr()))
            },
        }
    }

    /// Writes `bytes` whole, at once, or drops them; with `wait`, waits that long for room.
    fn put(&mut self, bytes: &[u8], wait: Duration) {
        let room = |fd: RawFd, wait: Duration| {
            let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
            let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: poll on one pollfd we own.
            unsafe { libc::poll(&mut p, 1, ms) == 1 }
        };
        if self.poll_first && !self.fd.is_some_and(|fd| room(fd, Duration::ZERO)) {
            self.dropped += 1;
            return;
        }
        let mut written = self.writer.write(bytes);
        if let Err(e) = &written
            && e.kind() == ErrorKind::WouldBlock
            && !wait.is_zero()
            && self.fd.is_some_and(|fd| room(fd, wait))
        {
            written = self.writer.write(bytes);
        }
        if !written.as_ref().is_ok_and(|n| *n == bytes.len()) {
            self.dropped += 1;
        }
        if let Err(e) = &written
            && e.kind() != ErrorKind::WouldBlock
        {
            self.failed.get_or_insert_with(|| io_cause(e));
        }
    }
}

pub(crate) struct Logger {
    out: Out,
    file: Option<Out>,
    /// stderr is a terminal: waiting messages redraw one line instead of adding lines.
    live: bool,
    /// The live line on screen, redrawn after any other line.
    shown: Option<String>,
    /// The summary is written: it stays the last line, whatever another thread still logs.
    closed: bool,
    format: Format,
    /// The warnings logged so far (the first `KEPT_WARNINGS`), for the record.
    warnings: Vec<String>,
}

/// One line, at most `MAX_LINE` bytes, control characters turned into spaces.
fn format_line(time: SystemTime, level: Level, message: &str) -> String {
    let level = format!("{level:?}").to_ascii_lowercase();
    let mut line = format!("{}\t{level}\tenvoy-drain\t", humantime::format_rfc3339_micros(time));
    line.extend(message.chars().map(|c| if c.is_control() { ' ' } else { c }));
    line.truncate(line.floor_char_boundary(MAX_LINE - 1));
    line.push('\n');
    line
}

/// One JSON object, at most `MAX_LINE` bytes, the message cut to fit; `fields` are more members,
/// already written (`,"name":value...`).
pub(crate) fn json_line(time: SystemTime, level: Level, message: &str, fields: &str) -> String {
    let level = format!("{level:?}").to_ascii_lowercase();
    let head = format!(
        "{{\"time\":\"{}\",\"level\":\"{level}\",\"logger\":\"envoy-drain\",\"msg\":",
        humantime::format_rfc3339_micros(time)
    );
    // Room for the message once escaped: at worst 6 bytes a character (\u0000). Cut first to
    // what a line can hold at all, so that escaping never walks a long message whole.
    let room = MAX_LINE.saturating_sub(head.len() + fields.len() + 4);
    let message = &message[..message.floor_char_boundary(MAX_LINE)];
    let mut msg = json_string(message);
    if msg.len() > room {
        let mut cut = message;
        while !cut.is_empty() && json_string(cut).len() > room {
            cut = &cut[..cut.floor_char_boundary(cut.len().saturating_sub(cut.len() / 8 + 1))];
        }
        msg = json_string(cut);
    }
    format!("{head}{msg}{fields}}}\n")
}

/// `s` as a JSON string, quoted, every control character escaped.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Logger {
    pub(crate) fn new(out: Out, live: bool) -> Logger {
        let (format, warnings) = (Format::Text, Vec::new());
        Logger { out, file: None, live, shown: None, closed: false, format, warnings }
    }

    /// Writes JSON lines from now on (no live line: a JSON log is for machines).
    pub(crate) fn set_format(&mut self, format: Format) {
        self.format = format;
        self.live &= format == Format::Text;
    }

    pub(crate) fn format(&self) -> Format {
        self.format
    }

    /// The warnings logged so far, the first `KEPT_WARNINGS` of them.
    pub(crate) fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Logs to stderr, live when it is a terminal.
    pub(crate) fn stderr() -> Logger {
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(libc::STDERR_FILENO) } == 1;
        Logger::new(Out::stderr(), tty)
    }

    /// Also appends every line to `path`, opened without blocking (a FIFO nobody reads fails at once).
    pub(crate) fn add_file(&mut self, path: &Path) {
        let opened = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path);
        match opened {
            Ok(f) => self.file = Some(Out::file(f)),
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ENXIO) => "nothing reads it".to_string(),
                    _ => io_cause(&e),
                };
                let failed = failed("open", format!("log file {}", path.display()), why);
                self.line(Level::Warn, &format!("{failed}; logging to stderr only"));
            }
        }
    }

    /// Lines dropped so far, and why one could not be written other than for want of room.
    pub(crate) fn dropped(&self) -> (u64, Option<&str>) {
        let outs = std::iter::once(&self.out).chain(&self.file);
        let lines = outs.clone().map(|o| o.dropped).sum();
        (lines, outs.filter_map(|o| o.failed.as_deref()).next())
    }

    pub(crate) fn line(&mut self, level: Level, message: &str) {
        self.write(level, message, "", Duration::ZERO);
    }

    /// The last line, in JSON with `fields` too: it may wait a little for room that the others
    /// do not. Whether it was written, not one before it.
    pub(crate) fn last_line(&mut self, level: Level, message: &str, fields: &str) -> bool {
        self.write(level, message, fields, SUMMARY_WAIT);
        !std::mem::replace(&mut self.closed, true)
    }

    fn write(&mut self, level: Level, message: &str, fields: &str, wait: Duration) {
        if self.closed {
            return;
        }
        if level == Level::Warn && self.warnings.len() < KEPT_WARNINGS {
            self.warnings
                .push(message[..message.floor_char_boundary(KEPT_WARNING_BYTES)].to_string());
        }
        let text = match self.format {
            Format::Text => format_line(SystemTime::now(), level, message),
            Format::Json => json_line(SystemTime::now(), level, message, fields),
        };
        if let Some(f) = &mut self.file {
            f.put(text.as_bytes(), wait);
        }
        if self.live && self.shown.is_some() {
            self.out.put(b"\r\x1b[K", Duration::ZERO);
        }
        self.out.put(text.as_bytes(), wait);
        if let Some(live) = &self.shown {
            self.out.put(live.as_bytes(), Duration::ZERO);
        }
    }

    /// A waiting update: on a terminal the live line redrawn; elsewhere a line when `worth_a_line`.
    pub(crate) fn waiting(&mut self, message: &str, worth_a_line: bool) {
        if self.closed {
            return;
        }
        if !self.live {
            if worth_a_line {
                self.line(Level::Info, message);
            }
            return;
        }
        if worth_a_line && let Some(f) = &mut self.file {
            let line = match self.format {
                Format::Text => format_line(SystemTime::now(), Level::Info, message),
                Format::Json => json_line(SystemTime::now(), Level::Info, message, ""),
            };
            f.put(line.as_bytes(), Duration::ZERO);
        }
        // One terminal row, or `\r` cannot take the cursor back to its start.
        let text: String = format!("envoy-drain: {message}")
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(terminal_width().saturating_sub(1))
            .collect();
        self.out.put(format!("\r\x1b[K{text}").as_bytes(), Duration::ZERO);
        self.shown = Some(text);
    }

    /// Ends the live line so that the next line starts clean.
    pub(crate) fn end_live(&mut self) {
        if self.shown.take().is_some() {
            self.out.put(b"\r\x1b[K", Duration::ZERO);
        }
    }
}

fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize we own; on failure it stays zeroed.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) };
    if size.ws_col == 0 { 80 } else { usize::from(size.ws_col) }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Captured;
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
        assert!(l.ends_with("\twarn\tenvoy-drain\tbad body  [2Jhere \n"), "{l:?}");
    }

    #[test]
    fn a_json_line_is_one_object_escaped_and_cut_to_fit_a_pipes_atomic_write() {
        let t = SystemTime::UNIX_EPOCH;
        let l = json_line(t, Level::Warn, "a \"quote\", a \\, a\nline, \u{1b}[2J", ",\"n\":1");
        assert_eq!(
            l,
            "{\"time\":\"1970-01-01T00:00:00.000000Z\",\"level\":\"warn\",\"logger\":\"envoy-drain\",\
             \"msg\":\"a \\\"quote\\\", a \\\\, a\\nline, \\u001b[2J\",\"n\":1}\n"
        );
        let long = "é\u{7}".repeat(2000);
        let l = json_line(t, Level::Info, &long, ",\"event\":\"summary\"");
        assert!(l.len() <= MAX_LINE && l.ends_with("\",\"event\":\"summary\"}\n"), "{}", l.len());
        assert_eq!(l.matches('\n').count(), 1);
    }

    #[test]
    fn nothing_follows_the_last_line() {
        for live in [false, true] {
            let captured = Captured::default();
            let mut log = Logger::new(Out::new(Box::new(captured.clone())), live);
            log.last_line(Level::Warn, "interrupted by SIGTERM", "");
            log.line(Level::Info, "1 active connection (proc)");
            log.waiting("1 active connection (proc)", true);
            let text = captured.text();
            assert!(text.ends_with("interrupted by SIGTERM\n"), "{live}: {text:?}");
            assert_eq!(text.matches("active connection").count(), 0, "{live}: {text:?}");
        }
    }

    #[test]
    fn waiting_updates_become_lines_only_when_worth_it_off_a_terminal() {
        let captured = Captured::default();
        let mut log = Logger::new(Out::new(Box::new(captured.clone())), false);
        log.waiting("3 open", true);
        log.waiting("3 open", false);
        log.waiting("2 open", true);
        let text = captured.text();
        assert_eq!(text.lines().count(), 2);
        assert!(!text.contains('\r'));
    }

    #[test]
    fn on_a_terminal_waiting_redraws_one_line_and_other_lines_keep_it() {
        let captured = Captured::default();
        let mut log = Logger::new(Out::new(Box::new(captured.clone())), true);
        log.waiting("3 open", true);
        log.waiting("2 open", false);
        log.line(Level::Warn, "stats unavailable");
        log.end_live();
        log.line(Level::Info, "done");
        let text = captured.text();
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
        let captured = Captured::default();
        let mut log = Logger::new(Out::new(Box::new(captured.clone())), false);
        log.add_file(Path::new("/nonexistent-dir/x.log"));
        log.line(Level::Info, "still logging");
        let text = captured.text();
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
        let mut log = Logger::new(Out::new(Box::new(Captured::default())), false);
        log.add_file(&path);
        log.line(Level::Info, "one");
        log.waiting("two", true);
        log.waiting("not a line", false);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    }
}
