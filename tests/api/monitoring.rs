//! deploy/monitoring against the service and promtool: the PrometheusRule's
//! groups pass `promtool check rules` and the alert unit tests
//! (`promtool test rules`), every alert has a firing and a quiet test, and
//! every metric the alerts and the Grafana dashboard name is one a running
//! server exports on /metrics, with the labels they select on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use context_service::client::deliveries::DeliverBody;
use context_service::pool::view::{CreatePool, CreateWorkspace};

use crate::common::workload_bundles::{tgz, tgz_raw_name, MEDIA};
use crate::common::{Caller, TestServer};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/monitoring");

/// Series Prometheus makes itself, not the service.
const FROM_PROMETHEUS: &[&str] = &["up"];

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(DIR).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The PrometheusRule's `spec.groups`, as a Prometheus rule file.
fn rule_groups() -> Value {
    let rule: Value = serde_saphyr::from_str(&read("prometheusrule.yaml")).expect("YAML");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    serde_json::json!({ "groups": rule["spec"]["groups"] })
}

fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e} (install Debian's `prometheus` package; .ci/run does)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = tempfile::tempdir().unwrap();
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(dir.path().join("rules.yaml"), rule_groups().to_string()).unwrap();
    std::fs::write(
        dir.path().join("alerts-test.yaml"),
        read("alerts-test.yaml"),
    )
    .unwrap();
    let checked = promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    let alerts: BTreeSet<String> = rule_groups()["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect();
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    promtool(dir.path(), &["test", "rules", "alerts-test.yaml"]);

    // Every alert is tested both ways: it fires, and it stays quiet.
    let tests: Value = serde_saphyr::from_str(&read("alerts-test.yaml")).expect("YAML");
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests["tests"].as_array().expect("tests") {
        for t in case["alert_rule_test"].as_array().expect("alert_rule_test") {
            let name = t["alertname"].as_str().unwrap().to_owned();
            if t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fires.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    for alert in &alerts {
        assert!(fires.contains(alert), "no test where {alert} fires");
        assert!(quiet.contains(alert), "no test where {alert} stays quiet");
    }
    for required in [
        "ContextServiceHigh5xxRate",
        "ContextServiceUploadRejectionSpike",
        "ContextServiceBundleCacheThrash",
        "ContextServiceDeliveryFailures",
        "ContextServicePoolProvisioningStuck",
    ] {
        assert!(alerts.contains(required), "{required} missing");
    }
}

/// Every PromQL expression in `value` (the rules' `expr`, the dashboard's
/// `expr`, `query` and `definition` strings).
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => expressions(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

/// Metric selectors of `expr`: each metric name with the label names its
/// matchers use. Grafana's variables become values PromQL parses, and its
/// `label_values(metric, label)` is read as a selector of `metric`.
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    use promql_parser::parser::Expr;
    use promql_parser::util::{walk_expr, ExprVisitor};

    struct Collect(Vec<(String, Vec<String>)>);
    impl ExprVisitor for Collect {
        type Error = std::convert::Infallible;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
            let vs = match expr {
                Expr::VectorSelector(vs) => vs,
                Expr::MatrixSelector(ms) => &ms.vs,
                _ => return Ok(true),
            };
            let labels = vs
                .matchers
                .matchers
                .iter()
                .map(|m| m.name.clone())
                .filter(|n| n != "__name__")
                .collect();
            self.0.push((vs.name.clone().unwrap_or_default(), labels));
            Ok(true)
        }
    }

    if let Some(args) = expr
        .trim()
        .strip_prefix("label_values(")
        .and_then(|a| a.strip_suffix(')'))
    {
        let (metric, label) = args.split_once(',').expect("label_values(metric, label)");
        let mut found = selectors(metric);
        found[0].1.push(label.trim().to_owned());
        return found;
    }
    let promql = expr.replace("$__rate_interval", "5m");
    let parsed =
        promql_parser::parser::parse(&promql).unwrap_or_else(|e| panic!("not PromQL: {e}\n{expr}"));
    let mut collect = Collect(Vec::new());
    let Ok(_) = walk_expr(&mut collect, &parsed);
    collect.0
}

/// The series names a /metrics scrape can hold, from its `# TYPE` lines (so
/// a family without samples yet counts), each with the label names seen on
/// its samples.
fn exported(scrape: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let series: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in series {
                names.entry(format!("{name}{suffix}")).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = names.entry(line[..end].to_owned()).or_default();
            if let Some(body) = line[end..].strip_prefix('{') {
                for pair in body[..body.find('}').unwrap_or(0)].split(',') {
                    if let Some((k, _)) = pair.split_once('=') {
                        labels.insert(k.trim().to_owned());
                    }
                }
            }
        }
    }
    names
}

#[test]
fn selectors_are_found() {
    let expr = r#"sum by (job, le) (rate(context_service_x_total{job=~"$job",status=~"5.."}[$__rate_interval])) / on(job) up and max(context_service_y) > 0.5"#;
    assert_eq!(
        selectors("label_values(context_service_z, job)"),
        vec![("context_service_z".to_owned(), vec!["job".to_owned()])]
    );
    assert_eq!(
        selectors(expr),
        vec![
            (
                "context_service_x_total".to_owned(),
                vec!["job".to_owned(), "status".to_owned()]
            ),
            ("up".to_owned(), vec![]),
            ("context_service_y".to_owned(), vec![]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_dashboard_reference_exported_metrics() {
    let server = TestServer::start().await;
    // Traffic that makes every labelled family the alerts select on
    // have samples: requests, an accepted and a rejected upload, downloads
    // (a cache load, then a hit), a pool, deliveries and a release.
    let client = server.client("alice");
    client.create_workload(Some("docs"), None).await.unwrap();
    let rev = client
        .upload_bundle("docs", tgz(&[("a.md", b"a\n")]))
        .await
        .unwrap();
    client
        .activate_workload("docs", &rev.revision)
        .await
        .unwrap();
    client.create_workload(Some("bad"), None).await.unwrap();
    let rejected = Caller::user(&server, "alice")
        .put(
            "/v1/workloads/bad/bundle",
            MEDIA,
            tgz_raw_name("../x", b"x"),
        )
        .await;
    assert_eq!(rejected.status(), 400);
    let dir = tempfile::tempdir().unwrap();
    for i in 0..2 {
        client
            .download_bundle(
                "docs",
                &rev.revision,
                &dir.path().join(format!("{i}")),
                |_, _| {},
            )
            .await
            .unwrap();
    }
    client
        .create_pool(&CreatePool {
            name: "team".to_owned(),
            replicas: 1,
            warm_pool_ref: None,
            workspace: CreateWorkspace {
                size: Some("1Gi".to_owned()),
                access_mode: Some("ReadWriteOnce".to_owned()),
                ..CreateWorkspace::default()
            },
            ttl: None,
        })
        .await
        .unwrap();
    // A delivery sent, one answered by the sandbox's cache, a release.
    for run in ["r1", "r2"] {
        let body = DeliverBody {
            run_id: run.to_owned(),
            sandbox: None,
            pool: Some("team".to_owned()),
            verify: None,
        };
        client.deliver("docs", &body).await.unwrap();
    }
    client.release("docs", "r1").await.unwrap();

    let scrape = Caller::anonymous(&server)
        .get("/metrics")
        .await
        .text()
        .await
        .unwrap();
    let exported = exported(&scrape);
    assert!(
        exported.contains_key("context_service_http_requests_total"),
        "{scrape}"
    );

    let mut exprs = Vec::new();
    expressions(&rule_groups(), &mut exprs);
    let rules = exprs.len();
    let dashboard: Value =
        serde_json::from_str(&read("context-service-dashboard.json")).expect("dashboard JSON");
    expressions(&dashboard, &mut exprs);
    assert!(rules >= 5 && exprs.len() > rules + 15, "{exprs:#?}");

    let mut used = BTreeSet::new();
    for expr in &exprs {
        for (metric, labels) in selectors(expr) {
            if FROM_PROMETHEUS.contains(&metric.as_str()) {
                continue;
            }
            used.insert(metric.clone());
            let seen = exported.get(&metric).unwrap_or_else(|| {
                panic!("`{metric}` (in `{expr}`) is not exported; /metrics has:\n{scrape}")
            });
            for label in labels {
                // `job` and `instance` come from the scrape.
                assert!(
                    label == "job" || label == "instance" || seen.contains(&label),
                    "`{metric}` has no label `{label}` (in `{expr}`); seen: {seen:?}"
                );
            }
        }
    }
    // The dashboard shows every family the service exports.
    let shown: BTreeSet<&str> = used
        .iter()
        .map(|m| {
            ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| m.strip_suffix(s))
                .unwrap_or(m)
        })
        .collect();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let family = rest.split_whitespace().next().unwrap();
            assert!(
                shown.contains(family),
                "`{family}` is exported but on no dashboard panel or alert"
            );
        }
    }
}
