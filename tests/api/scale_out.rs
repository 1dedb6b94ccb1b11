//! Metadata on PostgreSQL (`--database-url`), over real HTTP: two services
//! on one database (separate data dirs, as two replicas) see one set of
//! workloads, grants and activations; a database outage answers `503
//! database_unavailable` and the same service serves again, without a
//! restart, once the database is back.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::postgres::Cluster;
use crate::common::workload_bundles::{tgz, MEDIA};
use crate::common::{assert_error, Caller, TestServer};
use context_service::store::DatabaseUrl;

/// Asserts `status` and returns the JSON body, with or without the trailing
/// newline [`crate::common::json_of`] requires (the workload and delivery
/// answers carry none).
pub(crate) async fn json_of(resp: reqwest::Response, status: u16) -> Value {
    let got = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    assert_eq!(got, status, "body: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Copies the development signing key, so both services trust one token.
pub(crate) fn share_auth(from: &Path, to: &Path) {
    let (src, dst) = (from.join("auth"), to.join("auth"));
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
}

/// Two services on the database `url`, each with its own data dir.
async fn replicas(url: &DatabaseUrl) -> (TestServer, TestServer) {
    let a = TestServer::start_with(|c| c.database_url = Some(url.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    share_auth(&a.data_dir, dir.path());
    let b = TestServer::start_in(dir.path(), |c| c.database_url = Some(url.clone())).await;
    (a, b.owning(dir))
}

async fn create(caller: &Caller, name: &str) -> Value {
    json_of(
        caller.post("/v1/workloads", &json!({ "name": name })).await,
        201,
    )
    .await
}

#[tokio::test]
async fn two_services_share_workloads_grants_and_deletes() {
    let url = Cluster::shared().create_database();
    let (a, b) = replicas(&url).await;
    let (alice_a, alice_b) = (Caller::user(&a, "alice"), Caller::user(&b, "alice"));

    // Created on A, listed and read on B.
    let created = create(&alice_a, "shared").await;
    let listed = json_of(alice_b.get("/v1/workloads").await, 200).await;
    assert_eq!(listed["workloads"][0]["name"], "shared", "{listed}");
    // The name is taken on both.
    assert_error(
        alice_b
            .post("/v1/workloads", &json!({ "name": "shared" }))
            .await,
        409,
        "workload_name_taken",
        "a workload named \"shared\" already exists",
    )
    .await;

    // The one-time grant A issued: used once on A, refused on B.
    let grant = &created["upload"];
    let (grant_url, token) = (
        grant["url"].as_str().unwrap(),
        grant["token"].as_str().unwrap(),
    );
    let bundle = tgz(&[("f.txt", b"one")]);
    let uploaded = json_of(
        Caller::with_token(&a, token)
            .put(grant_url, MEDIA, bundle.clone())
            .await,
        201,
    )
    .await;
    assert_error(
        Caller::with_token(&b, token)
            .put(grant_url, MEDIA, bundle.clone())
            .await,
        401,
        "token_invalid",
        "the upload grant is invalid or was already used",
    )
    .await;
    let on_b = json_of(alice_b.get("/v1/workloads/shared").await, 200).await;
    assert_eq!(on_b["candidateRevision"], uploaded["revision"], "{on_b}");

    // Deleted on A: gone on B.
    let resp = alice_a.delete("/v1/workloads/shared").await;
    assert_eq!(resp.status().as_u16(), 204);
    assert_error(
        alice_b.get("/v1/workloads/shared").await,
        404,
        "workload_not_found",
        "workload \"shared\" not found",
    )
    .await;
}

/// A and B each upload their own bundle to one workload and activate it,
/// at once: exactly one activation wins everywhere; the other service's
/// attempt gets a documented 409 (its upload is refused because the
/// workload is frozen, or its activation finds another revision).
#[tokio::test]
async fn racing_activations_on_two_services_have_one_winner() {
    let url = Cluster::shared().create_database();
    let (a, b) = replicas(&url).await;
    let callers = [Caller::user(&a, "alice"), Caller::user(&b, "alice")];
    for round in 0..6 {
        let name = format!("race-{round}");
        create(&callers[0], &name).await;
        let attempts = callers.iter().enumerate().map(|(i, caller)| {
            let (caller, name) = (caller.clone(), name.clone());
            async move {
                let bundle = tgz(&[("who", format!("service {i} round {round}").as_bytes())]);
                let resp = caller
                    .put(&format!("/v1/workloads/{name}/bundle"), MEDIA, bundle)
                    .await;
                if resp.status().as_u16() != 201 {
                    return Err(resp);
                }
                let rev: Value = resp.json().await.unwrap();
                let resp = caller
                    .post(
                        &format!("/v1/workloads/{name}/activate"),
                        &json!({ "revision": rev["revision"] }),
                    )
                    .await;
                if resp.status().as_u16() != 200 {
                    return Err(resp);
                }
                Ok(resp.json::<Value>().await.unwrap())
            }
        });
        let results = futures::future::join_all(attempts).await;
        let mut winners = Vec::new();
        for result in results {
            match result {
                Ok(view) => winners.push(view),
                Err(resp) => {
                    let text = resp.text().await.unwrap();
                    let body: Value = serde_json::from_str(&text).unwrap();
                    let message = body["message"].as_str().unwrap_or_default();
                    let documented = match body["error"].as_str() {
                        Some("workload_already_active") => {
                            message.contains("is already active")
                                || message.contains("is active and frozen")
                        }
                        Some("revision_mismatch") => message.contains("is not the latest upload"),
                        _ => false,
                    };
                    assert!(documented, "round {round}: loser answered {text}");
                }
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let active = &winners[0]["revision"];
        for caller in &callers {
            let seen = json_of(caller.get(&format!("/v1/workloads/{name}")).await, 200).await;
            assert_eq!(seen["status"], "ready");
            assert_eq!(&seen["revision"], active, "{seen}");
        }
    }
}

/// Polls `GET /v1/workloads` until it answers `status`; the last body.
async fn poll(caller: &Caller, status: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let resp = caller.get("/v1/workloads").await;
        let got = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        if got == status {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "still {got} after {within:?}, expected {status}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_answers_503_and_recovers_without_a_restart() {
    let cluster = Cluster::start();
    let url = cluster.create_database();
    let server = TestServer::start_with(|c| c.database_url = Some(url.clone())).await;
    let alice = Caller::user(&server, "alice");
    create(&alice, "kept").await;
    json_of(alice.get("/v1/workloads/kept").await, 200).await;

    // Traffic while the database goes away.
    let traffic = {
        let alice = alice.clone();
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..40 {
                statuses.push(alice.get("/v1/workloads/kept").await.status().as_u16());
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            statuses
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::task::block_in_place(|| cluster.stop());
    let statuses = traffic.await.unwrap();
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "only answers or 503s, never a 500: {statuses:?}"
    );

    // Down: every store call is a 503 with the documented body.
    poll(&alice, 503, Duration::from_secs(20)).await;
    for resp in [
        alice.get("/v1/workloads/kept").await,
        alice.get("/v1/workloads").await,
        alice
            .post("/v1/workloads", &json!({ "name": "later" }))
            .await,
    ] {
        assert_eq!(
            resp.headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("2")
        );
        assert_error(
            resp,
            503,
            "database_unavailable",
            "the metadata database is unavailable; retry shortly",
        )
        .await;
    }
    // The service itself stays up.
    assert_eq!(alice.get("/healthz").await.status().as_u16(), 200);

    // Back: the same service answers, with the records it had.
    tokio::task::block_in_place(|| cluster.restart());
    poll(&alice, 200, Duration::from_secs(20)).await;
    let kept = json_of(alice.get("/v1/workloads/kept").await, 200).await;
    assert_eq!(kept["name"], "kept");
    create(&alice, "later").await;
}

/// A service refuses to start on a database it cannot reach, naming the
/// setting, rather than falling back to the embedded store.
#[tokio::test]
async fn an_unreachable_database_stops_the_start() {
    let url: DatabaseUrl = "postgres://cs@127.0.0.1:1/cs".parse().unwrap();
    let err = match TestServer::try_start_with(|c| c.database_url = Some(url)).await {
        Ok(_) => panic!("started without its database"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("metadata database unavailable"), "{err}");
}

/// `sslmode=verify-full` (or `require`) with `sslrootcert`: the service
/// talks TLS to the database, checked against the CA; a server whose
/// certificate another CA signed, or one without TLS, stops the start with
/// a message that says so.
#[tokio::test]
async fn verified_tls_to_the_database() {
    let (ca, certificate, key) = crate::common::postgres::test_certificates();
    let cluster = Cluster::start_tls(&certificate, &key);
    let db = cluster.create_database();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let with = |base: &DatabaseUrl, params: &str| -> DatabaseUrl {
        format!("{}?{params}", base.expose()).parse().unwrap()
    };
    let verified = with(
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", ca_file.display()),
    );
    let server = TestServer::start_with(|c| c.database_url = Some(verified.clone())).await;
    create(&Caller::user(&server, "alice"), "over-tls").await;
    let db_name = db.expose().rsplit('/').next().unwrap().to_owned();
    let encrypted = cluster.psql(
        &db_name,
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
         WHERE application_name = 'context-service' AND ssl",
    );
    assert_ne!(encrypted, "0", "no TLS connection of the service");
    let names = cluster.psql(&db_name, "SELECT name FROM cs_workloads");
    assert_eq!(names, "over-tls");

    // `require` verifies too: the same CA passes, another CA does not.
    let required = with(
        &db,
        &format!("sslmode=require&sslrootcert={}", ca_file.display()),
    );
    let again = TestServer::start_with(|c| c.database_url = Some(required)).await;
    drop(again);
    let (other_ca, _, _) = crate::common::postgres::test_certificates();
    let other_file = dir.path().join("other-ca.pem");
    std::fs::write(&other_file, other_ca).unwrap();
    let wrong = with(
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", other_file.display()),
    );
    let err = match TestServer::try_start_with(|c| c.database_url = Some(wrong)).await {
        Ok(_) => panic!("started on a database whose certificate it cannot verify"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("metadata database unavailable"), "{err}");
    assert!(err.contains("certificate"), "{err}");

    // A server without TLS is refused when TLS is asked for.
    let plain = Cluster::shared().create_database();
    let err = match TestServer::try_start_with(|c| {
        c.database_url = Some(with(&plain, "sslmode=verify-full"));
    })
    .await
    {
        Ok(_) => panic!("started without TLS to its database"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("TLS"), "{err}");
}

/// `CONTEXT_SERVICE_TEST_DATABASE=postgres` (`make test-postgres`) really
/// moves test servers' metadata to PostgreSQL, and without it they stay on
/// the embedded store.
#[tokio::test]
async fn test_servers_follow_the_test_database_setting() {
    let server = TestServer::start().await;
    let alice = Caller::user(&server, "alice");
    create(&alice, "where").await;
    let redb = server.data_dir.join("store/meta.redb");
    if crate::common::postgres::requested() {
        let url = server
            .config()
            .database_url
            .clone()
            .expect("a database URL");
        assert!(!redb.exists(), "no embedded store beside PostgreSQL");
        let db = url.expose().rsplit('/').next().unwrap().to_owned();
        let names = Cluster::shared().psql(&db, "SELECT name FROM cs_workloads");
        assert_eq!(names, "where");
    } else {
        assert!(server.config().database_url.is_none());
        assert!(redb.exists());
    }
}

/// The docs' scale-out example (docs/scale-out.md), run as written against
/// a real PostgreSQL: `context-service serve` with `CS_DATABASE_URL`,
/// contextctl against it, and the rows it wrote read back with `psql`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_scale_out_example_runs() {
    let block = crate::readme_examples::marked_block("<!-- scale-out:");
    assert!(block.contains("context-service serve"), "{block}");

    let url = Cluster::shared().create_database();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("src/docs")).unwrap();
    std::fs::write(work.path().join("src/docs/guide.md"), "guide\n").unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_contextctl"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-ec")
        .arg(&block)
        .current_dir(work.path())
        .env("PATH", path)
        .env("CS_DATABASE_URL", url.expose())
        .env("CS_LISTEN_ADDR", format!("127.0.0.1:{port}"))
        .env("CONTEXT_SERVICE_URL", format!("http://127.0.0.1:{port}"))
        .env("CS_SHUTDOWN_GRACE", "0s")
        .env_remove("CONTEXT_SERVICE_TOKEN")
        .env_remove("CS_DATA_DIR")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the example finishes")
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "doc block failed ({}):\n{block}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l == "shared-docs"),
        "psql shows the record: {stdout}"
    );
    assert!(
        !work.path().join("replica-a/store/meta.redb").exists(),
        "no embedded store beside PostgreSQL"
    );
}
