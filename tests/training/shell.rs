//! One persistent bash per lab: `cd`, `export` and background jobs carry
//! over from one command to the next, as in the learner's terminal.
//!
//! bash runs in its own process group; dropping the [`Shell`] terminates
//! the whole group (an operator a lab started with `&` included).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// A bash process fed one command at a time.
pub struct Shell {
    child: Child,
    stdin: ChildStdin,
    output: Receiver<Vec<u8>>,
    buffer: Vec<u8>,
    marker: String,
    scripts: tempfile::TempDir,
    count: usize,
}

/// A command that did not finish normally.
#[derive(Debug)]
pub enum RunError {
    /// Still running after the timeout (output so far).
    Timeout(String),
    /// bash exited (output so far).
    Exited(String),
    /// The command could not be handed to bash.
    Io(std::io::Error),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Timeout(out) => {
                write!(f, "still running after the timeout; output so far:\n{out}")
            }
            RunError::Exited(out) => write!(f, "the lab's shell exited; output so far:\n{out}"),
            RunError::Io(e) => write!(f, "cannot talk to the lab's shell: {e}"),
        }
    }
}

impl Shell {
    /// Starts bash in `cwd` with the inherited environment, `env` set and
    /// `remove` unset.
    pub fn start(
        cwd: &Path,
        env: &[(String, String)],
        remove: &[String],
    ) -> std::io::Result<Shell> {
        let mut command = Command::new("bash");
        for name in remove {
            command.env_remove(name);
        }
        let mut child = command
            .args(["--noprofile", "--norc"])
            .current_dir(cwd)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let mut stdin = child.stdin.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let mut stdout = child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let (tx, output) = channel();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            while let Ok(n) = stdout.read(&mut chunk) {
                if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        // stderr joins stdout, so the two interleave as in a terminal.
        stdin.write_all(b"exec 2>&1\n")?;
        Ok(Shell {
            child,
            stdin,
            output,
            buffer: Vec::new(),
            marker: format!("__training_done_{:016x}__", rand::random::<u64>()),
            scripts: tempfile::tempdir()?,
            count: 0,
        })
    }

    /// Runs `command` (sourced, so it changes this shell's state) with stdin
    /// from /dev/null; returns its merged output and exit status.
    pub fn run(&mut self, command: &str, timeout: Duration) -> Result<(String, i32), RunError> {
        self.count += 1;
        let script = self.scripts.path().join(format!("{:03}.sh", self.count));
        std::fs::write(&script, format!("{command}\n")).map_err(RunError::Io)?;
        let line = format!(
            ". '{}' </dev/null\nprintf '\\n%s %s\\n' '{}' \"$?\"\n",
            script.display(),
            self.marker
        );
        self.stdin
            .write_all(line.as_bytes())
            .map_err(RunError::Io)?;
        self.stdin.flush().map_err(RunError::Io)?;
        let needle = format!("\n{} ", self.marker);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = find(&self.buffer, needle.as_bytes()) {
                let rest = &self.buffer[at + needle.len()..];
                if let Some(nl) = rest.iter().position(|b| *b == b'\n') {
                    let status = String::from_utf8_lossy(&rest[..nl])
                        .trim()
                        .parse()
                        .unwrap_or(-1);
                    let output = String::from_utf8_lossy(&self.buffer[..at]).into_owned();
                    self.buffer.drain(..at + needle.len() + nl + 1);
                    return Ok((output, status));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(chunk) => self.buffer.extend_from_slice(&chunk),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(RunError::Timeout(self.take_buffer()));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RunError::Exited(self.take_buffer()));
                }
            }
        }
    }

    fn take_buffer(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.buffer).into_owned();
        self.buffer.clear();
        out
    }
}

/// True when a process of group `pgid` is alive (zombies, which wait for
/// whoever inherited them to reap them, do not count).
fn live_members(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        // SAFETY: kill(2) with signal 0 only checks the group exists.
        return unsafe { libc::killpg(pgid, 0) == 0 };
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .any(|stat| {
            // "pid (comm) state ppid pgrp ...": comm may hold spaces; split after ')'.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            fields.first().is_some_and(|s| *s != "Z")
                && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid)
        })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl Drop for Shell {
    /// SIGTERM to the group (a background operator shuts down cleanly),
    /// SIGKILL to whatever is left after a few seconds.
    fn drop(&mut self) {
        let Ok(pgid) = i32::try_from(self.child.id()) else {
            return;
        };
        let group_alive = |child: &mut Child| {
            let _ = child.try_wait(); // reap bash itself
            live_members(pgid)
        };
        // SAFETY: the group is the one bash leads (process_group(0)).
        unsafe { libc::killpg(pgid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_alive(&mut self.child) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: as above.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell() -> Shell {
        Shell::start(Path::new("/"), &[], &[]).unwrap()
    }

    #[test]
    fn state_carries_over_and_stderr_is_merged() {
        let mut sh = shell();
        let t = Duration::from_secs(10);
        assert_eq!(
            sh.run("cd /tmp && export X=1", t).unwrap(),
            (String::new(), 0)
        );
        assert_eq!(
            sh.run("echo $PWD $X; echo err >&2", t).unwrap(),
            ("/tmp 1\nerr\n".into(), 0)
        );
        assert_eq!(
            sh.run("printf 'no newline'; false", t).unwrap(),
            ("no newline".into(), 1)
        );
        assert_eq!(
            sh.run("cat", t).unwrap(),
            (String::new(), 0),
            "stdin is /dev/null"
        );
        let (out, _) = sh.run("cat <<EOF\n$X\nEOF", t).unwrap();
        assert_eq!(out, "1\n");
    }

    #[test]
    fn a_hanging_command_times_out() {
        let mut sh = shell();
        let err = sh
            .run("echo started; sleep 30", Duration::from_millis(500))
            .unwrap_err();
        assert!(
            matches!(err, RunError::Timeout(ref out) if out == "started\n"),
            "{err}"
        );
    }

    #[test]
    fn background_jobs_die_with_the_shell() {
        let mut sh = shell();
        let (pid, _) = sh
            .run("sleep 300 & echo $!", Duration::from_secs(10))
            .unwrap();
        let pid: i32 = pid.trim().parse().unwrap();
        // SAFETY: signal 0 only checks the process exists.
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0);
        drop(sh);
        // Reaped by init (or a subreaper) shortly after; it must not be running.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running = state.split(' ').nth(2).is_some_and(|s| s != "Z");
        assert!(!running, "background job {pid} survived: {state}");
    }
}
