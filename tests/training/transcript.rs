//! Lab transcripts: parsing ```` ```console ```` blocks out of a lab's
//! Markdown and matching a command's real output against the expected one.
//!
//! The format (documented for authors in `training/README.md`):
//!
//! - a fenced block whose info string starts with `console` is a transcript;
//!   other blocks (`yaml`, `rust`, `sh`, ...) are listings and are not run;
//! - `$ command` starts a command; a line ending in `\` continues it, and a
//!   here-document (`<<EOF` ... `EOF`) belongs to it up to its delimiter;
//! - the lines after a command, up to the next `$ ` line, are its expected
//!   output (stdout and stderr merged);
//! - `[[anything]]` inside a line matches any text (also none); a line that is
//!   only `[[anything]]` matches any number of lines (also none);
//! - runs of spaces compare equal to one space (column padding), trailing
//!   spaces and leading/trailing blank lines are ignored; indentation counts;
//! - info-string attributes: `skip="reason"` (not run; the reason is printed),
//!   `cleanup` (also run, unchecked, after an earlier step failed) and
//!   `real-node` (run only on a plane with a real node, `KO_REAL_NODE=1`).

use std::fmt;
use std::path::{Path, PathBuf};

/// The info-string language of a transcript block.
pub const LANGUAGE: &str = "console";

/// One lab: a Markdown file and its transcript blocks, in file order.
#[derive(Debug, Clone)]
pub struct Lab {
    /// The file.
    pub path: PathBuf,
    /// Its transcript blocks.
    pub blocks: Vec<Block>,
    /// Relative link targets found in the text (for the link check).
    pub links: Vec<(usize, String)>,
}

/// A ```` ```console ```` block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    /// Why the block is not run, if it is not.
    pub skip: Option<String>,
    /// Run (unchecked) even after an earlier step of the lab failed.
    pub cleanup: bool,
    /// Needs the control plane's real node (a kubelet running containers).
    pub real_node: bool,
    /// Its commands.
    pub steps: Vec<Step>,
}

/// One command and its expected output.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// 1-based line of the `$ ` line.
    pub line: usize,
    /// The command as bash reads it (continuations and here-documents included).
    pub command: String,
    /// The expected output lines, as written.
    pub expected: Vec<String>,
}

/// A lab that cannot be parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.message)
    }
}

/// Labs are `training/<digit>*.md`, in name order.
pub fn discover(training_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut labs: Vec<PathBuf> = std::fs::read_dir(training_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "md")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect();
    labs.sort();
    Ok(labs)
}

/// Reads and parses a lab.
pub fn load(path: &Path) -> Result<Lab, ParseError> {
    let text = std::fs::read_to_string(path).map_err(|e| ParseError {
        path: path.to_path_buf(),
        line: 0,
        message: format!("cannot read: {e}"),
    })?;
    parse(path, &text)
}

struct Fence {
    ch: char,
    len: usize,
    indent: usize,
    info: String,
}

fn fence_of(line: &str) -> Option<Fence> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let ch = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = rest.chars().take_while(|c| *c == ch).count();
    if len < 3 {
        return None;
    }
    let info = rest[len..].trim().to_string();
    if ch == '`' && info.contains('`') {
        return None;
    }
    Some(Fence {
        ch,
        len,
        indent,
        info,
    })
}

fn closes(open: &Fence, line: &str) -> bool {
    fence_of(line).is_some_and(|f| f.ch == open.ch && f.len >= open.len && f.info.is_empty())
}

/// Parses a lab's Markdown.
pub fn parse(path: &Path, text: &str) -> Result<Lab, ParseError> {
    let err = |line: usize, message: String| ParseError {
        path: path.to_path_buf(),
        line,
        message,
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut links = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(open) = fence_of(lines[i]) else {
            collect_links(i + 1, lines[i], &mut links);
            i += 1;
            continue;
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !closes(&open, lines[i]) {
            let l = lines[i];
            let strip = l.len() - l.trim_start_matches(' ').len();
            body.push(&l[strip.min(open.indent)..]);
            i += 1;
        }
        if i == lines.len() {
            return Err(err(start + 1, "unclosed code block".into()));
        }
        i += 1;
        let mut words = open.info.splitn(2, char::is_whitespace);
        let language = words.next().unwrap_or_default();
        let attributes = words.next().unwrap_or_default();
        if language == LANGUAGE {
            let Attributes {
                skip,
                cleanup,
                real_node,
            } = parse_attributes(attributes).map_err(|m| err(start + 1, m))?;
            let steps = parse_steps(start + 2, &body).map_err(|(l, m)| err(l, m))?;
            if steps.is_empty() {
                return Err(err(
                    start + 1,
                    "a console block without `$ ` commands".into(),
                ));
            }
            blocks.push(Block {
                line: start + 1,
                skip,
                cleanup,
                real_node,
                steps,
            });
        } else if matches!(
            language,
            "sh" | "bash" | "shell" | "shell-session" | "text" | ""
        ) && body.iter().any(|l| l.starts_with("$ "))
        {
            return Err(err(
                start + 1,
                format!(
                    "a ```{language} block with `$ ` lines would not be checked: use ```{LANGUAGE} (add skip=\"why\" if it must not run)"
                ),
            ));
        }
    }
    Ok(Lab {
        path: path.to_path_buf(),
        blocks,
        links,
    })
}

/// A block's info-string attributes.
struct Attributes {
    skip: Option<String>,
    cleanup: bool,
    real_node: bool,
}

/// `skip="reason"`, `cleanup` and `real-node`.
fn parse_attributes(s: &str) -> Result<Attributes, String> {
    let mut skip = None;
    let mut cleanup = false;
    let mut real_node = false;
    let mut rest = s.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("skip=\"") {
            let end = r
                .find('"')
                .ok_or_else(|| "skip=\"...\" is not closed".to_string())?;
            let reason = r[..end].trim();
            if reason.is_empty() {
                return Err("skip=\"\" needs a reason".into());
            }
            skip = Some(reason.to_string());
            rest = r[end + 1..].trim_start();
        } else if let Some(r) = rest.strip_prefix("cleanup") {
            if !(r.is_empty() || r.starts_with(char::is_whitespace)) {
                return Err(format!("unknown attribute in {s:?}"));
            }
            cleanup = true;
            rest = r.trim_start();
        } else if let Some(r) = rest.strip_prefix("real-node") {
            if !(r.is_empty() || r.starts_with(char::is_whitespace)) {
                return Err(format!("unknown attribute in {s:?}"));
            }
            real_node = true;
            rest = r.trim_start();
        } else {
            return Err(format!(
                "unknown attribute {:?} (known: skip=\"reason\", cleanup, real-node)",
                rest.split_whitespace().next().unwrap_or(rest)
            ));
        }
    }
    Ok(Attributes {
        skip,
        cleanup,
        real_node,
    })
}

/// The here-document delimiters a command line opens (`<<EOF`, `<<'EOF'`,
/// `<<-"EOF"`), with whether leading tabs are stripped (`<<-`).
fn heredocs(line: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let b = line.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'<' && b[i + 1] == b'<' {
            if b.get(i + 2) == Some(&b'<') {
                i += 3;
                continue;
            }
            let mut j = i + 2;
            let dash = b.get(j) == Some(&b'-');
            if dash {
                j += 1;
            }
            while b.get(j) == Some(&b' ') {
                j += 1;
            }
            let quote = b.get(j).copied().filter(|c| *c == b'\'' || *c == b'"');
            if quote.is_some() {
                j += 1;
            }
            let start = j;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            if j > start {
                found.push((line[start..j].to_string(), dash));
            }
            i = j.max(i + 2);
        } else {
            i += 1;
        }
    }
    found
}

fn parse_steps(first_line: usize, body: &[&str]) -> Result<Vec<Step>, (usize, String)> {
    let mut steps: Vec<Step> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let line = body[i];
        let Some(cmd) = line.strip_prefix("$ ") else {
            match steps.last_mut() {
                Some(step) => step.expected.push(line.to_string()),
                None if line.trim().is_empty() => {}
                None => {
                    return Err((
                        first_line + i,
                        "output before the first `$ ` command".into(),
                    ));
                }
            }
            i += 1;
            continue;
        };
        let line_no = first_line + i;
        let mut command = cmd.to_string();
        let mut current = cmd;
        let mut pending = heredocs(current);
        i += 1;
        while current.ends_with('\\') {
            let next = body.get(i).ok_or((
                line_no,
                "a `\\` continuation at the end of the block".into(),
            ))?;
            command.push('\n');
            command.push_str(next);
            current = next;
            pending.extend(heredocs(current));
            i += 1;
        }
        for (delimiter, dash) in pending {
            loop {
                let next = body.get(i).ok_or_else(|| {
                    (
                        line_no,
                        format!("here-document {delimiter:?} is not closed in the block"),
                    )
                })?;
                command.push('\n');
                command.push_str(next);
                i += 1;
                let end = if dash {
                    next.trim_start_matches('\t')
                } else {
                    next
                };
                if end == delimiter {
                    break;
                }
            }
        }
        steps.push(Step {
            line: line_no,
            command,
            expected: Vec::new(),
        });
    }
    Ok(steps)
}

fn collect_links(line_no: usize, line: &str, links: &mut Vec<(usize, String)>) {
    // Inline code (`[x](y)` in backticks) is not a link.
    let text: String = line
        .split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 0)
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ");
    let mut rest = text.as_str();
    while let Some(p) = rest.find("](") {
        let after = &rest[p + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].trim();
        if !target.is_empty()
            && !target.starts_with('#')
            && !target.contains("://")
            && !target.starts_with("mailto:")
        {
            let path = target.split('#').next().unwrap_or(target);
            links.push((line_no, path.to_string()));
        }
        rest = &after[end..];
    }
}

/// Trailing spaces removed, runs of spaces inside the line made one;
/// indentation kept.
fn normalize(line: &str) -> String {
    let line = line.trim_end();
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let mut out = String::from(indent);
    let mut space = false;
    for c in body.chars() {
        if c == ' ' || c == '\t' {
            space = true;
        } else {
            if space {
                out.push(' ');
                space = false;
            }
            out.push(c);
        }
    }
    out
}

/// True when `line` is a whole-line wildcard: only `[[...]]`.
fn is_any_lines(line: &str) -> bool {
    let t = line.trim();
    t.starts_with("[[") && t.ends_with("]]") && t.len() >= 4 && !t[2..t.len() - 2].contains("]]")
}

/// The literal pieces of an expected line, split at its `[[...]]` wildcards.
fn segments(line: &str) -> Vec<String> {
    let mut segs = Vec::new();
    let mut rest = line;
    loop {
        match rest
            .find("[[")
            .and_then(|s| rest[s..].find("]]").map(|e| (s, s + e + 2)))
        {
            Some((s, e)) => {
                segs.push(rest[..s].to_string());
                rest = &rest[e..];
            }
            None => {
                segs.push(rest.to_string());
                return segs;
            }
        }
    }
}

/// Does one actual line match one expected line (with inline wildcards)?
pub fn line_matches(expected: &str, actual: &str) -> bool {
    glob(&segments(&normalize(expected)), &normalize(actual))
}

/// `segs` are literals with a wildcard between each pair.
fn glob(segs: &[String], text: &str) -> bool {
    if segs.len() == 1 {
        return segs[0] == text;
    }
    let first = segs[0].trim_end();
    let last = segs[segs.len() - 1].trim_start();
    if !text.starts_with(first) {
        return false;
    }
    let mut pos = first.len();
    for mid in &segs[1..segs.len() - 1] {
        let mid = mid.trim();
        if mid.is_empty() {
            continue;
        }
        match text[pos..].find(mid) {
            Some(at) => pos += at + mid.len(),
            None => return false,
        }
    }
    text.len() >= pos + last.len() && text[pos..].ends_with(last)
}

/// Output lines with leading and trailing blank lines dropped.
pub fn trimmed_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| !l.trim().is_empty());
    let end = lines.iter().rposition(|l| !l.trim().is_empty());
    match (start, end) {
        (Some(s), Some(e)) => lines[s..=e].to_vec(),
        _ => Vec::new(),
    }
}

/// What client-go (in kubectl) may log when a watch it stops ends: `kubectl
/// wait` logs it, now and then, after its condition was met (kubectl 1.37).
/// It says nothing about the lab, and a lab's transcript does not show it.
const WATCH_ENDED: &str = "\"Warning: watch ended with error\"";

/// An output's lines as a transcript compares them: without client-go's
/// log lines about a watch that ended, and leading and trailing blank lines
/// dropped.
pub fn compared_lines(actual: &str) -> Vec<&str> {
    trimmed_lines(actual)
        .into_iter()
        .filter(|line| !(line.contains(WATCH_ENDED) && line.contains("reflector.go")))
        .collect()
}

/// Does the actual output match the expected lines?
pub fn output_matches(expected: &[String], actual: &str) -> bool {
    let joined = expected.join("\n");
    let exp = trimmed_lines(&joined);
    let act = compared_lines(actual);
    let (m, n) = (exp.len(), act.len());
    // ok[i][j]: exp[i..] matches act[j..].
    let mut ok = vec![vec![false; n + 1]; m + 1];
    ok[m][n] = true;
    for i in (0..m).rev() {
        let any = is_any_lines(exp[i]);
        for j in (0..=n).rev() {
            ok[i][j] = if any {
                ok[i + 1][j] || (j < n && ok[i][j + 1])
            } else {
                j < n && ok[i + 1][j + 1] && line_matches(exp[i], act[j])
            };
        }
    }
    ok[0][0]
}

/// The 1-based index of the first expected line that does not match its
/// actual line, when the expected output has no whole-line wildcard.
pub fn first_difference(expected: &[String], actual: &str) -> Option<usize> {
    let joined = expected.join("\n");
    let exp = trimmed_lines(&joined);
    if exp.iter().any(|l| is_any_lines(l)) {
        return None;
    }
    let act = compared_lines(actual);
    (0..exp.len().max(act.len())).find_map(|i| match (exp.get(i), act.get(i)) {
        (Some(e), Some(a)) if line_matches(e, a) => None,
        _ => Some(i + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab(text: &str) -> Result<Lab, ParseError> {
        parse(Path::new("lab.md"), text)
    }

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(String::from).collect()
    }

    #[test]
    fn parses_commands_outputs_and_line_numbers() {
        let l = lab("# Lab\n\n```console\n$ echo a\na\n$ true\n```\n\ntext\n").unwrap();
        assert_eq!(
            l.blocks,
            vec![Block {
                line: 3,
                skip: None,
                cleanup: false,
                real_node: false,
                steps: vec![
                    Step {
                        line: 4,
                        command: "echo a".into(),
                        expected: vec!["a".into()]
                    },
                    Step {
                        line: 6,
                        command: "true".into(),
                        expected: vec![]
                    },
                ],
            }]
        );
    }

    #[test]
    fn continuations_and_heredocs_belong_to_the_command() {
        let l = lab(
            "```console\n$ kubectl apply -f - <<EOF\napiVersion: v1\n$ not a command\nEOF\nout\n$ echo a \\\n  b <<-'X'\n\tx\n\tX\n```\n",
        )
        .unwrap();
        let steps = &l.blocks[0].steps;
        assert_eq!(
            steps[0].command,
            "kubectl apply -f - <<EOF\napiVersion: v1\n$ not a command\nEOF"
        );
        assert_eq!(steps[0].expected, vec!["out"]);
        assert_eq!(steps[1].command, "echo a \\\n  b <<-'X'\n\tx\n\tX");
        assert_eq!(steps[1].line, 7);
    }

    #[test]
    fn here_strings_are_not_heredocs() {
        assert!(heredocs("grep x <<< \"$y\"").is_empty());
        assert_eq!(
            heredocs("cat <<\"E_1\" >f"),
            vec![("E_1".to_string(), false)]
        );
    }

    #[test]
    fn attributes() {
        let l = lab("```console skip=\"needs a kubelet\" cleanup\n$ x\n```\n").unwrap();
        assert_eq!(l.blocks[0].skip.as_deref(), Some("needs a kubelet"));
        assert!(l.blocks[0].cleanup);
        assert!(!l.blocks[0].real_node);
        let l = lab("```console real-node\n$ x\n```\n").unwrap();
        assert!(l.blocks[0].real_node && l.blocks[0].skip.is_none());
        assert!(lab("```console real-nodes\n$ x\n```\n").is_err());
        assert!(lab("```console skp=\"x\"\n$ x\n```\n").is_err());
        assert!(lab("```console skip=\"\"\n$ x\n```\n").is_err());
        assert!(lab("```console cleanupx\n$ x\n```\n").is_err());
    }

    #[test]
    fn malformed_labs_are_errors_with_line_numbers() {
        let e = lab("text\n```console\noutput first\n$ x\n```\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(lab("```console\n$ x\n").is_err(), "unclosed");
        assert!(lab("```console\n\n```\n").is_err(), "no command");
        assert!(
            lab("```sh\n$ kubectl get pods\n```\n").is_err(),
            "unchecked $ lines"
        );
        assert!(
            lab("```console\n$ cat <<EOF\nx\n```\n").is_err(),
            "open heredoc"
        );
        assert!(lab("```yaml\n$ not a shell\n```\n").is_ok());
    }

    #[test]
    fn longer_fences_hide_inner_fences() {
        let l = lab("````markdown\n```console\n$ rm -rf /\n```\n````\n").unwrap();
        assert!(l.blocks.is_empty());
    }

    #[test]
    fn relative_links_are_collected() {
        let l = lab("See [a](../src/a.rs#L3) and [b](https://x.y) and [c](#top), `[d](e)`.\n```rust\n[x](not/a/link)\n```\n").unwrap();
        assert_eq!(l.links, vec![(1, "../src/a.rs".to_string())]);
    }

    #[test]
    fn inline_wildcards() {
        assert!(line_matches(
            "lab01   Active   [[age]]",
            "lab01   Active   5s"
        ));
        assert!(line_matches("lab01 Active [[age]]", "lab01   Active   12m"));
        assert!(line_matches(
            "web-[[hash]]   0/1   Pending",
            "web-7d9f8b6c5d-x2x9z   0/1     Pending"
        ));
        assert!(line_matches("a[[x]]b[[y]]c", "abc"));
        assert!(line_matches("[[x]]", "anything at all"));
        assert!(!line_matches("lab01 Active [[age]]", "lab02 Active 5s"));
        assert!(!line_matches("a[[x]]b", "ba"));
        assert!(!line_matches("  name: x", "name: x"), "indentation counts");
        assert!(line_matches("x   ", "x"), "trailing spaces do not");
    }

    #[test]
    fn whole_line_wildcards_match_any_number_of_lines() {
        let exp = lines("first\n[[more lines]]\nlast");
        assert!(output_matches(&exp, "first\nlast\n"));
        assert!(output_matches(&exp, "first\na\nb\nlast\n"));
        assert!(!output_matches(&exp, "first\na\n"));
        assert!(output_matches(&lines("[[anything]]"), ""));
        assert!(!output_matches(&lines("a"), "a\nb"));
        assert!(!output_matches(&[], "unexpected"));
        assert!(output_matches(&[], "\n\n"));
        assert!(output_matches(&lines("\na\n\n"), "a"));
    }

    #[test]
    fn a_watch_client_go_ended_is_not_part_of_the_output() {
        let actual = "I1202 08:58:47.986003    1109 reflector.go:664] \"Warning: watch ended with error\" reflector=\"k8s.io/client-go@v0.37.2/tools/cache/reflector.go:343\" err=\"context canceled\"\n\
                      sample.nuvolaris.org/web condition met\n";
        assert!(output_matches(
            &lines("sample.nuvolaris.org/web condition met"),
            actual
        ));
        assert_eq!(
            first_difference(&lines("sample.nuvolaris.org/web condition met"), actual),
            None
        );
        // Any other line still counts.
        assert!(!output_matches(
            &lines("sample.nuvolaris.org/web condition met"),
            "Warning: watch ended with error\nsample.nuvolaris.org/web condition met"
        ));
    }

    #[test]
    fn first_difference_names_the_line() {
        assert_eq!(first_difference(&lines("a\nb\nc"), "a\nx\nc"), Some(2));
        assert_eq!(first_difference(&lines("a"), "a\nb"), Some(2));
        assert_eq!(first_difference(&lines("a"), "a"), None);
    }
}
