//! The output a doc block shows: lines starting `#> ` (or a bare `#>`, an
//! empty line) after a command are what that command prints on stdout.
//! Being comments, they leave the block runnable as pasted. A checked block
//! is run with a marker printed before each command, so that its stdout
//! splits into one part per command, and each part is compared with the
//! lines the doc shows after the command.
//!
//! Comparison: runs of spaces count as one (columns may be re-aligned), `...`
//! in a line stands for any text, and a line that is only `...` for any
//! number of lines. A command with no `#>` lines is not checked; one with
//! `#>` lines must print exactly those. A command is a line that is not
//! blank, not a comment and does not continue the line before (which ends
//! with `\`, `|`, `&&` or `||`); a heredoc or a multi-line quote or `$(...)`
//! would split wrongly, so a checked block may not hold one (heredocs are
//! refused).

/// Marks the start of command `n` in a checked block's stdout: a line of
/// its own (the leading newline ends a part that printed no final newline).
fn marker(n: usize) -> String {
    format!("\n\x1e{n}\x1e\n")
}

/// One command of a checked block and the lines the doc shows for it.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// A doc block made ready to run and check.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The block with a marker printed before each command (the block
    /// itself when it shows no output).
    pub(crate) script: String,
    steps: Vec<Step>,
}

impl Checked {
    /// Instruments `block`; a block with no `#>` line runs as it is.
    ///
    /// # Panics
    /// On `#>` lines before the first command, or a heredoc in a block
    /// that shows output: the doc is malformed.
    pub(crate) fn new(block: &str) -> Self {
        let mut steps: Vec<Step> = Vec::new();
        if !block.lines().any(|l| shown_line(l).is_some()) {
            return Self {
                script: block.to_owned(),
                steps,
            };
        }
        let mut script = String::new();
        let mut continues = false;
        for line in block.lines() {
            if let Some(text) = shown_line(line) {
                let step = steps
                    .last_mut()
                    .unwrap_or_else(|| panic!("output shown before any command:\n{block}"));
                step.shown.push(text.to_owned());
                continue;
            }
            let code = line.trim();
            let heredoc = code.contains("<<") && !code.contains("<<<");
            assert!(
                !heredoc,
                "a block that shows output cannot hold a heredoc:\n{line}"
            );
            if !continues && !code.is_empty() && !code.starts_with('#') {
                // The same bytes as `marker(steps.len())`.
                script.push_str(&format!("printf '\\n\\036{}\\036\\n'\n", steps.len()));
                steps.push(Step {
                    command: code.to_owned(),
                    shown: Vec::new(),
                });
            }
            script.push_str(line);
            script.push('\n');
            let code = code.split(" #").next().unwrap_or(code).trim_end();
            continues = ["\\", "|", "&&", "||"]
                .iter()
                .any(|end| code.ends_with(end));
        }
        Self { script, steps }
    }

    /// How many lines of output the block shows.
    pub(crate) fn shown_lines(&self) -> usize {
        self.steps.iter().map(|s| s.shown.len()).sum()
    }

    /// Compares what the block printed with what it shows: `Err` names the
    /// first command whose output differs, with both.
    pub(crate) fn verify(&self, stdout: &str) -> Result<(), String> {
        if self.steps.is_empty() {
            return Ok(());
        }
        for (n, step) in self.steps.iter().enumerate() {
            let start = marker(n);
            let Some(at) = stdout.find(&start) else {
                return Err(format!(
                    "`{}` never ran (no marker {n} in stdout)",
                    step.command
                ));
            };
            let rest = &stdout[at + start.len()..];
            let part = &rest[..rest.find(&marker(n + 1)).unwrap_or(rest.len())];
            if step.shown.is_empty() {
                continue;
            }
            let printed: Vec<&str> = part.lines().collect();
            if !lines_match(&step.shown, &printed) {
                return Err(format!(
                    "`{}` printed:\n{}\nbut the doc shows:\n{}",
                    step.command,
                    printed.join("\n"),
                    step.shown.join("\n")
                ));
            }
        }
        Ok(())
    }
}

/// The text of a shown-output line, `None` for any other line.
fn shown_line(line: &str) -> Option<&str> {
    match line.strip_prefix("#>")? {
        "" => Some(""),
        rest => rest.strip_prefix(' '),
    }
}

/// Whether `printed` is what `shown` shows: a `...` line takes any number
/// of lines, every other line matches one.
fn lines_match(shown: &[String], printed: &[&str]) -> bool {
    match shown.split_first() {
        None => printed.is_empty(),
        Some((first, rest)) if first.trim() == "..." => {
            (0..=printed.len()).any(|skip| lines_match(rest, &printed[skip..]))
        }
        Some((first, rest)) => printed
            .split_first()
            .is_some_and(|(line, more)| line_matches(first, line) && lines_match(rest, more)),
    }
}

/// Whether one printed line matches one shown line, spaces collapsed and
/// `...` matching any text.
fn line_matches(shown: &str, printed: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (shown, printed) = (squeeze(shown), squeeze(printed));
    let mut parts = shown.split("...");
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = printed.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

mod tests {
    use super::*;

    /// Runs `block` checked under `bash -e`, as the doc test does but with
    /// no service: the checker's result.
    fn run(block: &str) -> Result<(), String> {
        let checked = Checked::new(block);
        let out = std::process::Command::new("bash")
            .arg("-ec")
            .arg(&checked.script)
            .output()
            .expect("bash runs");
        assert!(out.status.success(), "{block}: {out:?}");
        checked.verify(&String::from_utf8_lossy(&out.stdout))
    }

    const BLOCK: &str = "\
printf 'NAME   STATUS\\nguide  ready\\n'
#> NAME   STATUS
#> guide  ready
echo unchecked
printf 'a\\nb\\nc\\nd'      # no final newline
#> a
#> ...
#> d
echo one two |
  tr a-z A-Z
#> ONE TWO
echo
#>
echo 'sha256:0123 verified'
#> sha256:... verified";

    #[test]
    fn the_shown_output_passes() {
        assert_eq!(run(BLOCK), Ok(()));
    }

    /// The point of the checker: a doc line that no longer matches what the
    /// command prints fails, and says which command.
    #[test]
    fn a_wrong_shown_line_fails() {
        let wrong = BLOCK.replace("#> guide  ready", "#> guide  failed");
        let err = run(&wrong).expect_err("a wrong line must fail");
        assert!(err.contains("printf 'NAME"), "{err}");
        assert!(err.contains("guide  failed"), "{err}");

        let wrong = BLOCK.replace("#> sha256:... verified", "#> sha256:... checked");
        let err = run(&wrong).expect_err("a wrong line must fail");
        assert!(err.starts_with("`echo 'sha256:0123 verified'`"), "{err}");
    }

    #[test]
    fn a_line_missing_from_the_doc_fails() {
        let short = BLOCK.replace("#> guide  ready\n", "");
        assert!(run(&short).is_err());
        let extra = BLOCK.replace("#> ONE TWO", "#> ONE TWO\n#> THREE");
        assert!(run(&extra).is_err());
    }

    #[test]
    fn a_command_that_did_not_run_fails() {
        let checked = Checked::new("echo a\n#> a\necho b\n#> b");
        assert_eq!(checked.shown_lines(), 2);
        let err = checked.verify(&format!("{}a\n", marker(0))).unwrap_err();
        assert!(err.contains("`echo b` never ran"), "{err}");
    }

    #[test]
    fn wildcards_and_spaces() {
        assert!(line_matches("a ... z", "a b c z"));
        assert!(line_matches("a...", "a"));
        assert!(line_matches("...", ""));
        assert!(line_matches("x   y", "x y"));
        assert!(!line_matches("a...b...c", "a c b"));
        assert!(!line_matches("ab...ba", "aba"));
        assert!(!line_matches("abc", "abcd"));
        let shown = |l: &[&str]| l.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert!(lines_match(&shown(&["...", "z"]), &["x", "y", "z"]));
        assert!(lines_match(&shown(&["a", "..."]), &["a"]));
        assert!(!lines_match(&shown(&["a"]), &["a", "b"]));
    }

    #[test]
    fn a_block_without_shown_output_runs_as_written() {
        let block = "cat <<EOF\nx\nEOF";
        assert_eq!(Checked::new(block).script, block);
    }
}
