//! The standard process metrics of the Prometheus clients
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …, as
//! client_golang names them), read from `/proc/self` on every scrape.
//! prometheus-client has no such collector.

use std::fs;
use std::io;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use rustix::process::{getrlimit, Resource};

/// One reading of the process's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: u64,
    /// Start time since the Unix epoch, in seconds.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit of open file descriptors (`None`: unlimited).
    pub max_fds: Option<u64>,
}

/// Why the figures could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProcessStatsError {
    /// A `/proc` file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A `/proc` file had an unexpected shape.
    #[error("parsing {path}: {what}")]
    Parse {
        /// The file.
        path: &'static str,
        /// What was missing or malformed.
        what: &'static str,
    },
}

const STAT: &str = "/proc/self/stat";
const KERNEL_STAT: &str = "/proc/stat";
const FDS: &str = "/proc/self/fd";

fn read(path: &'static str) -> Result<String, ProcessStatsError> {
    fs::read_to_string(path).map_err(|source| ProcessStatsError::Read { path, source })
}

/// The fields of `/proc/<pid>/stat` this collector needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// `utime + stime`, in clock ticks.
    cpu_ticks: u64,
    /// Start time after boot, in clock ticks.
    start_ticks: u64,
    vsize: u64,
    /// Resident pages.
    rss_pages: u64,
}

/// Parses `/proc/<pid>/stat` (see proc(5)). The command name (field 2) is
/// in parentheses and may hold spaces and parentheses itself, so fields
/// are counted after its last `)`.
fn parse_stat(text: &str) -> Result<Stat, ProcessStatsError> {
    let bad = |what| ProcessStatsError::Parse { path: STAT, what };
    let (_, rest) = text.rsplit_once(')').ok_or(bad("no command name"))?;
    // `rest` starts at field 3 (state): field n is at index n - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize, what| -> Result<u64, ProcessStatsError> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or(bad(what))
    };
    Ok(Stat {
        cpu_ticks: field(14, "utime")? + field(15, "stime")?,
        start_ticks: field(22, "starttime")?,
        vsize: field(23, "vsize")?,
        // rss is signed in the kernel's format; never negative in practice.
        rss_pages: field(24, "rss")?,
    })
}

/// The boot time (`btime`) of `/proc/stat`, in seconds since the epoch.
fn parse_boot_time(text: &str) -> Result<u64, ProcessStatsError> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(ProcessStatsError::Parse {
            path: KERNEL_STAT,
            what: "btime",
        })
}

fn open_fds() -> Result<u64, ProcessStatsError> {
    let entries =
        fs::read_dir(FDS).map_err(|source| ProcessStatsError::Read { path: FDS, source })?;
    // The directory handle read_dir holds is one of the entries; like
    // client_golang, it is counted.
    Ok(entries.filter(Result::is_ok).count() as u64)
}

impl ProcessStats {
    /// Reads the figures of this process now.
    pub fn read() -> Result<Self, ProcessStatsError> {
        let stat = parse_stat(&read(STAT)?)?;
        let boot = parse_boot_time(&read(KERNEL_STAT)?)?;
        let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
        let page = rustix::param::page_size() as u64;
        Ok(Self {
            cpu_seconds: stat.cpu_ticks as f64 / ticks,
            resident_bytes: stat.rss_pages.saturating_mul(page),
            virtual_bytes: stat.vsize,
            start_time_seconds: boot as f64 + stat.start_ticks as f64 / ticks,
            open_fds: open_fds()?,
            max_fds: getrlimit(Resource::Nofile).current,
        })
    }
}

/// The collector of the process metrics; register it on a registry
/// without a prefix, so the names are the standard ones.
#[derive(Debug, Default)]
pub struct ProcessCollector;

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(metric)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = match ProcessStats::read() {
            Ok(s) => s,
            Err(e) => {
                // A scrape without these beats a failed scrape.
                tracing::warn!(error = %e, "process metrics unavailable");
                return Ok(());
            }
        };
        let cpu = ConstCounter::new(stats.cpu_seconds);
        let metric = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(metric)?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            stats.open_fds as f64,
        )?;
        if let Some(max) = stats.max_fds {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max as f64,
            )?;
        }
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            stats.virtual_bytes as f64,
        )?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            stats.resident_bytes as f64,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            stats.start_time_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        // A command name with spaces and parentheses, as a process may set.
        let mut fields = vec!["S".to_owned()];
        fields.extend((4..=52).map(|n| n.to_string()));
        let text = format!("1234 (a) b (c)) {}\n", fields.join(" "));
        assert_eq!(
            parse_stat(&text).unwrap(),
            Stat {
                cpu_ticks: 14 + 15,
                start_ticks: 22,
                vsize: 23,
                rss_pages: 24,
            }
        );
        assert!(parse_stat("1234 (x) S 1 2").is_err());
        assert!(parse_stat("no name").is_err());
    }

    #[test]
    fn boot_time_is_read_from_btime() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n";
        assert_eq!(parse_boot_time(text).unwrap(), 1_700_000_000);
        assert!(parse_boot_time("cpu 1\n").is_err());
    }

    #[test]
    fn this_process_reads_sanely() {
        let s = ProcessStats::read().unwrap();
        assert!(s.resident_bytes > 0);
        assert!(s.virtual_bytes >= s.resident_bytes);
        assert!(s.open_fds >= 3, "{s:?}");
        assert_eq!(s.max_fds, getrlimit(Resource::Nofile).current);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Started before now, and not before a day ago (tests are short).
        assert!(
            s.start_time_seconds <= now + 1.0 && s.start_time_seconds > now - 86_400.0,
            "{s:?} now {now}"
        );
    }
}
