//! The one-screen summary: requests and unexpected answers by phase and
//! code, p50/p99 per operation, the faults, the RSS curves, and the
//! invariants with their verdicts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::checks::StoreFacts;
use crate::ledger::{Entry, Outcome, Target, Upload};
use crate::stack::{FaultWindow, RssSample};

/// Everything the summary is made of.
pub(crate) struct Run<'a> {
    pub(crate) users: usize,
    pub(crate) duration: Duration,
    /// How long after a fault's end its effects still count as the fault
    /// (pools reconnecting, clients waiting out `Retry-After`).
    pub(crate) settle: Duration,
    pub(crate) entries: &'a [Entry],
    pub(crate) faults: &'a [FaultWindow],
    pub(crate) uploads: &'a [Upload],
    pub(crate) rss: &'a [RssSample],
    pub(crate) stores: &'a StoreFacts,
}

/// A phase's requests and its unexpected answers by label.
type PhaseTally = (usize, BTreeMap<String, usize>);

/// The shortest run whose RSS curves are judged.
const RSS_MIN_RUN: Duration = Duration::from_secs(8 * 60);

/// How an unexpected answer is judged.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Expected by the step.
    Ok,
    /// `429` with `Retry-After`: back-pressure, documented, retried.
    Throttled,
    /// A documented fault answer during a fault.
    Documented,
    /// Anything else: a finding.
    Violation,
}

impl Run<'_> {
    /// The phase of an entry: a fault it overlaps (window + settle), else
    /// `before` the first fault or `after` (recovered).
    fn phase(&self, e: &Entry) -> &'static str {
        for f in self.faults {
            if e.end >= f.start && e.start <= f.end + self.settle {
                return f.name;
            }
        }
        match self.faults.first() {
            Some(f) if e.end < f.start => "before",
            None => "before",
            _ => "after",
        }
    }

    fn verdict(&self, e: &Entry) -> Verdict {
        if e.expected {
            return Verdict::Ok;
        }
        let phase = self.phase(e);
        match &e.outcome {
            Outcome::Status {
                code: 429,
                retry_after: true,
                ..
            } => Verdict::Throttled,
            Outcome::Status {
                code: 503,
                retry_after: true,
                ..
            } if phase != "before" && phase != "after" => Verdict::Documented,
            // In flight on, or sent straight to, the killed replica.
            Outcome::Transport(_) if phase == "kill-A" => {
                if e.target == Target::B {
                    Verdict::Violation
                } else {
                    Verdict::Documented
                }
            }
            _ => Verdict::Violation,
        }
    }

    /// The summary, and whether every invariant holds.
    pub(crate) fn summary(&self) -> (String, bool) {
        let mut s = String::new();
        let secs = self.duration.as_secs_f64();
        let n = self.entries.len();
        let _ = writeln!(
            s,
            "soak: {} users for {:.0} s; two replicas on PostgreSQL + SeaweedFS behind a round-robin balancer",
            self.users, secs
        );
        let uploaded: u64 = self.uploads.iter().map(|u| u.bytes).sum();
        let _ = writeln!(
            s,
            "requests: {n} ({:.1}/s); {} uploads answered 201, {} MiB stored",
            n as f64 / secs.max(1.0),
            self.uploads.len(),
            uploaded >> 20
        );

        // Phases.
        let mut phases: BTreeMap<(usize, &'static str), PhaseTally> = BTreeMap::new();
        let order = |p: &str| match p {
            "before" => 0,
            "after" => 9,
            other => {
                1 + self
                    .faults
                    .iter()
                    .position(|f| f.name == other)
                    .unwrap_or(0)
            }
        };
        let mut violations = 0;
        let mut documented = 0;
        let mut throttled = 0;
        for e in self.entries {
            let phase = self.phase(e);
            let slot = phases.entry((order(phase), phase)).or_default();
            slot.0 += 1;
            match self.verdict(e) {
                Verdict::Ok => {}
                v => {
                    let tag = match v {
                        Verdict::Violation => {
                            violations += 1;
                            "!"
                        }
                        Verdict::Documented => {
                            documented += 1;
                            ""
                        }
                        _ => {
                            throttled += 1;
                            "~"
                        }
                    };
                    *slot
                        .1
                        .entry(format!("{tag}{} {}", e.op, e.outcome.label()))
                        .or_default() += 1;
                }
            }
        }
        let _ = writeln!(
            s,
            "unexpected answers by phase (op code: count; ! = not documented, ~ = 429 back-pressure):"
        );
        for ((_, phase), (count, codes)) in &phases {
            let window = self
                .faults
                .iter()
                .find(|f| f.name == *phase)
                .map(|f| format!(" {:.0}-{:.0} s", f.start.as_secs_f64(), f.end.as_secs_f64()))
                .unwrap_or_default();
            let codes: Vec<String> = codes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let _ = writeln!(
                s,
                "  {phase:<10}{window:<12} {count:>7} req  {}",
                if codes.is_empty() {
                    "none".to_owned()
                } else {
                    codes.join(", ")
                }
            );
        }

        // Latencies of the expected answers.
        let mut ops: BTreeMap<&'static str, (usize, Vec<f64>)> = BTreeMap::new();
        for e in self.entries {
            let slot = ops.entry(e.op).or_default();
            slot.0 += 1;
            if e.expected {
                slot.1
                    .push((e.end.saturating_sub(e.start)).as_secs_f64() * 1000.0);
            }
        }
        let _ = writeln!(s, "operation       requests   expected   p50 ms   p99 ms");
        for (op, (count, mut ms)) in ops {
            ms.sort_by(f64::total_cmp);
            let pct = |p: f64| {
                if ms.is_empty() {
                    0.0
                } else {
                    ms[((ms.len() as f64 - 1.0) * p).round() as usize]
                }
            };
            let _ = writeln!(
                s,
                "  {op:<14}{count:>9}{:>11}{:>9.0}{:>9.0}",
                ms.len(),
                pct(0.50),
                pct(0.99)
            );
        }

        let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
        for e in self
            .entries
            .iter()
            .filter(|e| e.op == "hostile-upload" && e.expected)
        {
            *refusals.entry(e.outcome.label()).or_default() += 1;
        }
        let refusals: Vec<String> = refusals.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(s, "hostile uploads refused: {}", refusals.join(", "));

        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|f| {
                format!(
                    "{} at {:.0} s (back after {:.1} s)",
                    f.name,
                    f.start.as_secs_f64(),
                    (f.end - f.start).as_secs_f64()
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "faults (+{} s settle): {}",
            self.settle.as_secs(),
            faults.join(", ")
        );

        let (rss_lines, rss_ok) = self.rss_curves();
        s.push_str(&rss_lines);

        // Invariants.
        let verified = self.uploads.iter().filter(|u| u.verified).count();
        let abandoned = self
            .uploads
            .iter()
            .filter(|u| !u.verified && u.abandoned)
            .count();
        // Uploads in the last minute may have been cut by the end of the run.
        let cutoff = self.duration.saturating_sub(Duration::from_secs(60));
        let unfinished_late = self
            .uploads
            .iter()
            .filter(|u| !u.verified && !u.abandoned && u.at >= cutoff)
            .count();
        let lost = self
            .uploads
            .iter()
            .filter(|u| !u.verified && !u.abandoned && u.at < cutoff)
            .count();
        let mismatches = self
            .entries
            .iter()
            .filter(|e| e.outcome == Outcome::DigestMismatch)
            .count();
        let steady_errors = self
            .entries
            .iter()
            .filter(|e| {
                matches!(self.phase(e), "before" | "after") && self.verdict(e) == Verdict::Violation
            })
            .count();
        let fault_violations = violations - steady_errors;
        let st = self.stores;
        let checks = [
            (
                lost == 0,
                format!(
                    "every upload 201 then activated and downloaded with its digest: {verified} of {} ({abandoned} given up after a fault error, {unfinished_late} cut by the end)",
                    self.uploads.len()
                ),
            ),
            (
                mismatches == 0,
                format!("no download or delivery with other bytes ({mismatches})"),
            ),
            (
                st.missing.is_empty(),
                format!(
                    "no revision names a missing blob: {} records name {} digests, {} objects, {} missing",
                    st.workloads,
                    st.named,
                    st.objects,
                    st.missing.len()
                ),
            ),
            (
                st.orphans.is_empty(),
                format!(
                    "no blob nothing names, after the sweep: {} left (checked {:.0} s after the load)",
                    st.orphans.len(),
                    st.swept_after.as_secs_f64()
                ),
            ),
            (
                st.leftovers.is_empty(),
                format!(
                    "no temp file or staging dir left: {}",
                    if st.leftovers.is_empty() {
                        "none".to_owned()
                    } else {
                        format!("{:?}", st.leftovers)
                    }
                ),
            ),
            (
                fault_violations == 0,
                format!(
                    "every error during a fault is documented: {documented} documented, {fault_violations} not"
                ),
            ),
            (
                steady_errors == 0,
                format!("no error outside the faults: {steady_errors} ({throttled} 429 back-pressure answers, retried)"),
            ),
            (
                rss_ok,
                "RSS flat (last quarter within 1.5x of the second; runs of 8 min or more)"
                    .to_owned(),
            ),
        ];
        let _ = writeln!(s, "invariants:");
        let mut all = true;
        for (ok, text) in checks {
            all &= ok;
            let _ = writeln!(s, "  [{}] {text}", if ok { "ok" } else { "FAIL" });
        }
        (s, all)
    }

    /// One line per replica process: RSS (MiB) about every tenth of the
    /// run; and whether each stayed flat.
    fn rss_curves(&self) -> (String, bool) {
        let mut s = String::new();
        let mut ok = true;
        let mut procs: Vec<(&'static str, u32)> = Vec::new();
        for r in self.rss {
            if !procs.contains(&(r.replica, r.pid)) {
                procs.push((r.replica, r.pid));
            }
        }
        let step = self.duration.as_secs_f64() / 10.0;
        let _ = writeln!(s, "RSS MiB, one value per {step:.0} s:");
        for (replica, pid) in procs {
            let samples: Vec<&RssSample> = self
                .rss
                .iter()
                .filter(|r| r.replica == replica && r.pid == pid)
                .collect();
            let mut curve = Vec::new();
            let mut next = 0.0;
            for r in &samples {
                if r.at.as_secs_f64() >= next {
                    curve.push(format!("{}", r.kib / 1024));
                    next = r.at.as_secs_f64() + step;
                }
            }
            let median = |part: &[&RssSample]| {
                let mut v: Vec<u64> = part.iter().map(|r| r.kib).collect();
                v.sort_unstable();
                v.get(v.len() / 2).copied().unwrap_or(0)
            };
            let q = samples.len() / 4;
            // The caches and allocator take minutes to warm up under the
            // load (the 10-minute run): a shorter run cannot tell a plateau
            // from a leak, so it only reports the curve.
            let verdict = if self.duration < RSS_MIN_RUN {
                "run too short to judge".to_owned()
            } else if q >= 2 {
                let (second, last) = (median(&samples[q..2 * q]), median(&samples[3 * q..]));
                let ratio = last as f64 / second.max(1) as f64;
                ok &= ratio <= 1.5;
                format!("last/second quarter x{ratio:.2}")
            } else {
                "too short to judge".to_owned()
            };
            let _ = writeln!(
                s,
                "  {replica} (pid {pid}): {}  [{verdict}]",
                curve.join(" ")
            );
        }
        (s, ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn entry(op: &'static str, target: Target, at: u64, outcome: Outcome, expected: bool) -> Entry {
        Entry {
            op,
            target,
            start: secs(at),
            end: secs(at) + Duration::from_millis(200),
            outcome,
            expected,
        }
    }

    fn status(code: u16, error: &str, retry_after: bool) -> Outcome {
        Outcome::Status {
            code,
            error: Some(error.to_owned()),
            retry_after,
        }
    }

    fn faults() -> Vec<FaultWindow> {
        vec![
            FaultWindow {
                name: "kill-A",
                start: secs(100),
                end: secs(105),
            },
            FaultWindow {
                name: "pg-restart",
                start: secs(200),
                end: secs(202),
            },
        ]
    }

    fn flat_rss() -> Vec<RssSample> {
        (0..40)
            .map(|i| RssSample {
                at: secs(i * 10),
                replica: "B",
                pid: 7,
                kib: 100_000 + i,
            })
            .collect()
    }

    fn run<'a>(
        entries: &'a [Entry],
        faults: &'a [FaultWindow],
        rss: &'a [RssSample],
        stores: &'a StoreFacts,
    ) -> Run<'a> {
        Run {
            users: 2,
            duration: secs(600),
            settle: secs(15),
            entries,
            faults,
            uploads: &[],
            rss,
            stores,
        }
    }

    #[test]
    fn phases_follow_the_fault_windows_and_their_settle_time() {
        let (faults, stores, rss) = (faults(), StoreFacts::default(), flat_rss());
        let r = run(&[], &faults, &rss, &stores);
        let at = |s| entry("read", Target::Balancer, s, status(200, "", false), true);
        assert_eq!(r.phase(&at(50)), "before");
        assert_eq!(r.phase(&at(100)), "kill-A");
        assert_eq!(r.phase(&at(119)), "kill-A");
        assert_eq!(r.phase(&at(121)), "after");
        assert_eq!(r.phase(&at(201)), "pg-restart");
        assert_eq!(r.phase(&at(300)), "after");
    }

    #[test]
    fn only_documented_answers_pass_during_a_fault_and_none_outside() {
        let (faults, stores, rss) = (faults(), StoreFacts::default(), flat_rss());
        let r = run(&[], &faults, &rss, &stores);
        let retry = status(503, "database_unavailable", true);
        // 503 + Retry-After: documented during a fault, not outside one.
        assert!(
            r.verdict(&entry(
                "create",
                Target::Balancer,
                201,
                retry.clone(),
                false
            )) == Verdict::Documented
        );
        assert!(
            r.verdict(&entry("create", Target::Balancer, 300, retry, false)) == Verdict::Violation
        );
        // 503 without Retry-After: never documented.
        let bare = status(503, "database_unavailable", false);
        assert!(
            r.verdict(&entry("create", Target::Balancer, 201, bare, false)) == Verdict::Violation
        );
        // A broken connection: documented while A is down, for requests
        // that may have reached A, never for B.
        let reset = Outcome::Transport("reset");
        assert!(
            r.verdict(&entry(
                "upload",
                Target::Balancer,
                101,
                reset.clone(),
                false
            )) == Verdict::Documented
        );
        assert!(
            r.verdict(&entry("deliver", Target::A, 101, reset.clone(), false))
                == Verdict::Documented
        );
        assert!(
            r.verdict(&entry("deliver", Target::B, 101, reset.clone(), false))
                == Verdict::Violation
        );
        assert!(
            r.verdict(&entry("upload", Target::Balancer, 201, reset, false)) == Verdict::Violation
        );
        // Back-pressure anywhere; a digest mismatch never.
        let busy = status(429, "too_many_uploads", true);
        assert!(
            r.verdict(&entry("upload", Target::Balancer, 300, busy, false)) == Verdict::Throttled
        );
        let bad = Outcome::DigestMismatch;
        assert!(r.verdict(&entry("read", Target::Balancer, 101, bad, false)) == Verdict::Violation);
    }

    #[test]
    fn the_summary_fails_on_a_steady_error_a_missing_blob_or_a_growing_rss() {
        let (faults, rss) = (faults(), flat_rss());
        let clean = StoreFacts::default();
        let ok = [entry(
            "read",
            Target::Balancer,
            300,
            status(200, "", false),
            true,
        )];
        let (text, pass) = run(&ok, &faults, &rss, &clean).summary();
        assert!(pass, "{text}");

        let err = [entry(
            "read",
            Target::Balancer,
            300,
            status(500, "internal", false),
            false,
        )];
        let (text, pass) = run(&err, &faults, &rss, &clean).summary();
        assert!(!pass, "{text}");
        assert!(
            text.contains("[FAIL] no error outside the faults: 1"),
            "{text}"
        );

        let missing = StoreFacts {
            missing: vec!["ab".repeat(32)],
            ..StoreFacts::default()
        };
        let (text, pass) = run(&ok, &faults, &rss, &missing).summary();
        assert!(!pass, "{text}");

        let growing: Vec<RssSample> = (0..40)
            .map(|i| RssSample {
                at: secs(i * 10),
                replica: "B",
                pid: 7,
                kib: 100_000 + i * 10_000,
            })
            .collect();
        let (text, pass) = run(&ok, &faults, &growing, &clean).summary();
        assert!(!pass, "{text}");
        assert!(text.contains("[FAIL] RSS flat"), "{text}");
        // A short run reports the curve without judging it.
        let mut short = run(&ok, &faults, &growing, &clean);
        short.duration = secs(180);
        let (text, pass) = short.summary();
        assert!(pass, "{text}");
        assert!(text.contains("run too short to judge"), "{text}");
    }
}
