//! One behaviour for every metadata store: the same tests run against the
//! embedded [`RedbStore`] and the [`PostgresStore`] (on a real PostgreSQL,
//! `tests/common/postgres.rs`). Races use two store instances where the
//! backend allows it — two PostgreSQL pools are two replicas; redb is one
//! file with one writer, so its "replica" is the same instance.

use std::sync::Arc;

use futures::future::join_all;
use tokio::sync::Barrier;

use context_service::store::{
    GrantRecord, MetadataStore, OwnerMigration, PostgresStore, RedbStore, RevisionRecord,
    RunRecord, RunSandbox, RunStore, StoreError, WorkloadRecord, WorkloadStatus,
    SCHEMA_OWNER_KINDS,
};

use crate::common::postgres::Cluster;

/// A store under test.
#[async_trait::async_trait]
trait Fixture: Send {
    /// The store.
    fn store(&self) -> Arc<dyn MetadataStore>;
    /// Its run registry.
    fn runs(&self) -> Arc<dyn RunStore>;
    /// Another instance on the same records (another replica).
    fn replica(&self) -> Arc<dyn MetadataStore>;
    /// Makes the records look like schema version 1 (no version recorded).
    async fn pretend_schema_v1(&mut self);
}

struct Redb {
    dir: tempfile::TempDir,
    store: Arc<RedbStore>,
}

impl Redb {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RedbStore::open(&dir.path().join("m.redb")).unwrap());
        Self { dir, store }
    }
}

#[async_trait::async_trait]
impl Fixture for Redb {
    fn store(&self) -> Arc<dyn MetadataStore> {
        self.store.clone()
    }
    fn runs(&self) -> Arc<dyn RunStore> {
        self.store.clone()
    }
    fn replica(&self) -> Arc<dyn MetadataStore> {
        self.store.clone()
    }
    async fn pretend_schema_v1(&mut self) {
        let path = self.dir.path().join("m.redb");
        // Close the store (the only handle) to open the file directly.
        let placeholder = tempfile::tempdir().unwrap();
        self.store = Arc::new(RedbStore::open(&placeholder.path().join("x.redb")).unwrap());
        {
            let db = ::redb::Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let meta: ::redb::TableDefinition<&str, u64> = ::redb::TableDefinition::new("meta");
                let mut table = txn.open_table(meta).unwrap();
                table.remove("schema_version").unwrap();
            }
            txn.commit().unwrap();
        }
        self.store = Arc::new(RedbStore::open(&path).unwrap());
        assert_eq!(self.store.schema_version().await.unwrap(), 1);
    }
}

struct Postgres {
    db: String,
    store: Arc<PostgresStore>,
    replica: Arc<PostgresStore>,
}

impl Postgres {
    async fn new() -> Self {
        let url = Cluster::shared().create_database();
        let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
        let replica = Arc::new(PostgresStore::connect(&url).await.unwrap());
        let db = url.expose().rsplit('/').next().unwrap().to_owned();
        Self { db, store, replica }
    }
}

#[async_trait::async_trait]
impl Fixture for Postgres {
    fn store(&self) -> Arc<dyn MetadataStore> {
        self.store.clone()
    }
    fn runs(&self) -> Arc<dyn RunStore> {
        self.store.clone()
    }
    fn replica(&self) -> Arc<dyn MetadataStore> {
        self.replica.clone()
    }
    async fn pretend_schema_v1(&mut self) {
        Cluster::shared().psql(&self.db, "DELETE FROM cs_meta WHERE key = 'schema_version'");
        assert_eq!(self.store.schema_version().await.unwrap(), 1);
    }
}

fn record(owner: &str, name: &str) -> WorkloadRecord {
    WorkloadRecord {
        owner: owner.into(),
        name: name.into(),
        uid: format!("uid-{owner}-{name}"),
        kind: "workspace".into(),
        status: WorkloadStatus::AwaitingUpload,
        candidate: None,
        active: None,
        failure: None,
        created_at_ms: 1,
        updated_at_ms: 1,
        version: 0,
    }
}

fn grant(id: &str, rec: &WorkloadRecord, expires_at_ms: u64) -> GrantRecord {
    GrantRecord {
        id: id.into(),
        token_sha256: "00".into(),
        owner: rec.owner.clone(),
        name: rec.name.clone(),
        workload_uid: rec.uid.clone(),
        expires_at_ms,
    }
}

fn revision(n: usize) -> RevisionRecord {
    RevisionRecord {
        revision: format!("{n:064x}"),
        bundle_digest: format!("{:064x}", n + 1000),
        files: 1,
        entries: 1,
        bytes: 10,
        bundle_encoding: "gzip+zlib-rs+level-1".into(),
        inflated_bytes: 20,
        uploaded_at_ms: 5,
        tree: None,
    }
}

async fn names(store: &dyn MetadataStore, owner: &str) -> Vec<String> {
    store
        .workloads_of(owner)
        .await
        .unwrap()
        .into_iter()
        .map(|r| format!("{}:{}", r.owner, r.name))
        .collect()
}

async fn insert_name_taken_and_quota(f: &mut dyn Fixture) {
    let store = f.store();
    let r1 = record("o", "one");
    store
        .insert_workload(&r1, &grant("g1", &r1, 10), 2)
        .await
        .unwrap();
    let stored = store.workload("o", "one").await.unwrap().unwrap();
    assert_eq!(stored.version, 1, "the store sets the first version");
    assert_eq!(
        stored,
        WorkloadRecord {
            version: 1,
            ..r1.clone()
        }
    );
    assert_eq!(store.grant("g1").await.unwrap(), Some(grant("g1", &r1, 10)));
    assert!(matches!(
        store.insert_workload(&r1, &grant("g1b", &r1, 10), 2).await,
        Err(StoreError::NameTaken)
    ));
    assert!(
        store.grant("g1b").await.unwrap().is_none(),
        "a refused insert stores no grant"
    );
    let r2 = record("o", "two");
    store
        .insert_workload(&r2, &grant("g2", &r2, 10), 2)
        .await
        .unwrap();
    let r3 = record("o", "three");
    assert!(matches!(
        store.insert_workload(&r3, &grant("g3", &r3, 10), 2).await,
        Err(StoreError::QuotaExceeded(2))
    ));
    // The quota is per owner; names sort by bytes; owners never see each
    // other's records whatever their names hold.
    for (owner, name) in [("a", "x"), ("ab", "x"), ("a/b", "x"), ("o2", "three")] {
        let r = record(owner, name);
        store
            .insert_workload(&r, &grant(&format!("g-{owner}-{name}"), &r, 10), 2)
            .await
            .unwrap();
    }
    assert_eq!(names(&*store, "o").await, ["o:one", "o:two"]);
    assert_eq!(names(&*store, "a").await, ["a:x"]);
    assert_eq!(names(&*store, "a/b").await, ["a/b:x"]);
    assert_eq!(store.all_workloads().await.unwrap().len(), 6);
    assert!(store.workload("a", "y").await.unwrap().is_none());
}

async fn quota_holds_across_replicas(f: &mut dyn Fixture) {
    let (a, b) = (f.store(), f.replica());
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let r = record("racer", &format!("w{i}"));
                barrier.wait().await;
                store
                    .insert_workload(&r, &grant(&format!("g{i}"), &r, 10), 3)
                    .await
            })
        })
        .collect();
    let results: Vec<_> = join_all(handles)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 3, "{results:?}");
    assert!(results
        .iter()
        .all(|r| matches!(r, Ok(()) | Err(StoreError::QuotaExceeded(3)))));
    assert_eq!(a.workloads_of("racer").await.unwrap().len(), 3);
}

async fn replace_is_compare_and_swap(f: &mut dyn Fixture) {
    let store = f.store();
    let r = record("o", "w");
    store
        .insert_workload(&r, &grant("g", &r, 10), 20)
        .await
        .unwrap();
    let current = store.workload("o", "w").await.unwrap().unwrap();
    let mut next = current.clone();
    next.candidate = Some(revision(1));
    let stored = store.replace_workload(&next, Some("g")).await.unwrap();
    assert_eq!(stored.version, 2);
    assert_eq!(store.workload("o", "w").await.unwrap().unwrap(), stored);
    assert!(
        store.grant("g").await.unwrap().is_none(),
        "the grant is consumed"
    );
    // A stale version, another incarnation, a used grant, a missing
    // record: each refused, nothing changed.
    assert!(matches!(
        store.replace_workload(&current, None).await,
        Err(StoreError::Conflict)
    ));
    let mut other_uid = stored.clone();
    other_uid.uid = "another".into();
    assert!(matches!(
        store.replace_workload(&other_uid, None).await,
        Err(StoreError::Conflict)
    ));
    assert!(matches!(
        store.replace_workload(&stored, Some("g")).await,
        Err(StoreError::GrantUsed)
    ));
    assert_eq!(store.workload("o", "w").await.unwrap().unwrap().version, 2);
    assert!(matches!(
        store.replace_workload(&record("o", "nope"), None).await,
        Err(StoreError::NotFound)
    ));
}

/// N threads on two instances race to consume one grant; each retries on
/// a lost compare-and-swap. Exactly one upload wins, every other one finds
/// the grant used.
async fn grant_is_consumed_exactly_once_across_replicas(f: &mut dyn Fixture) {
    let (a, b) = (f.store(), f.replica());
    let threads = 8;
    for round in 0..5 {
        let name = format!("w{round}");
        let r = record("o", &name);
        let grant_id = format!("g{round}");
        a.insert_workload(&r, &grant(&grant_id, &r, 10), 20)
            .await
            .unwrap();
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let store = if i % 2 == 0 { a.clone() } else { b.clone() };
                let (barrier, name, grant_id) = (barrier.clone(), name.clone(), grant_id.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    loop {
                        let mut next = store.workload("o", &name).await.unwrap().unwrap();
                        next.candidate = Some(revision(i));
                        match store.replace_workload(&next, Some(&grant_id)).await {
                            Ok(_) => return Some(i),
                            Err(StoreError::Conflict) => continue,
                            Err(StoreError::GrantUsed) => return None,
                            Err(e) => panic!("thread {i}: {e}"),
                        }
                    }
                })
            })
            .collect();
        let winners: Vec<usize> = join_all(handles)
            .await
            .into_iter()
            .filter_map(Result::unwrap)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let stored = b.workload("o", &name).await.unwrap().unwrap();
        assert_eq!(stored.version, 2, "exactly one write");
        assert_eq!(stored.candidate, Some(revision(winners[0])));
        assert!(a.grant(&grant_id).await.unwrap().is_none());
    }
}

/// Threads on two instances each read, change and write back one record
/// many times: every write that succeeded is counted in the version, so no
/// update was lost to a concurrent one.
async fn no_update_is_lost_across_replicas(f: &mut dyn Fixture) {
    let (a, b) = (f.store(), f.replica());
    let r = record("o", "counter");
    a.insert_workload(&r, &grant("g", &r, 10), 20)
        .await
        .unwrap();
    let threads = 6;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let mut won = 0u64;
                for _ in 0..20 {
                    let mut next = store.workload("o", "counter").await.unwrap().unwrap();
                    next.updated_at_ms += 1;
                    match store.replace_workload(&next, None).await {
                        Ok(_) => won += 1,
                        Err(StoreError::Conflict) => {}
                        Err(e) => panic!("thread {i}: {e}"),
                    }
                }
                won
            })
        })
        .collect();
    let won: u64 = join_all(handles)
        .await
        .into_iter()
        .map(Result::unwrap)
        .sum();
    let stored = b.workload("o", "counter").await.unwrap().unwrap();
    assert!(won >= 1);
    assert_eq!(
        stored.version,
        1 + won,
        "every successful write counted once"
    );
    assert_eq!(stored.updated_at_ms, 1 + won, "and none overwrote another");
}

async fn remove_takes_its_grants(f: &mut dyn Fixture) {
    let store = f.store();
    let r = record("o", "w");
    store
        .insert_workload(&r, &grant("g1", &r, 10), 20)
        .await
        .unwrap();
    store.insert_grant(&grant("g2", &r, 10)).await.unwrap();
    let keep = record("o", "keep");
    store
        .insert_workload(&keep, &grant("gk", &keep, 10), 20)
        .await
        .unwrap();
    assert!(matches!(
        store.remove_workload("o", "w", 7).await,
        Err(StoreError::Conflict)
    ));
    assert!(store.workload("o", "w").await.unwrap().is_some());
    store.remove_workload("o", "w", 1).await.unwrap();
    assert!(store.workload("o", "w").await.unwrap().is_none());
    assert!(
        store.grant("g1").await.unwrap().is_none(),
        "grants go with it"
    );
    assert!(store.grant("g2").await.unwrap().is_none());
    assert!(store.grant("gk").await.unwrap().is_some(), "others' stay");
    assert!(matches!(
        store.remove_workload("o", "w", 1).await,
        Err(StoreError::NotFound)
    ));
    // A grant removed once is gone; a second removal says so.
    assert!(store.remove_grant("gk").await.unwrap());
    assert!(!store.remove_grant("gk").await.unwrap());
}

async fn expired_grants_are_purged(f: &mut dyn Fixture) {
    let store = f.store();
    let r = record("o", "w");
    store
        .insert_workload(&r, &grant("old", &r, 5), 20)
        .await
        .unwrap();
    store.insert_grant(&grant("edge", &r, 10)).await.unwrap();
    store.insert_grant(&grant("new", &r, 50)).await.unwrap();
    assert_eq!(store.purge_expired_grants(10).await.unwrap(), 1);
    assert!(store.grant("old").await.unwrap().is_none());
    assert!(
        store.grant("edge").await.unwrap().is_some(),
        "expires after 10, not at"
    );
    assert!(store.grant("new").await.unwrap().is_some());
    assert_eq!(store.purge_expired_grants(10).await.unwrap(), 0);
    assert_eq!(store.workload("o", "w").await.unwrap().unwrap().version, 1);
}

async fn owners_migrate_once(f: &mut dyn Fixture) {
    let map = |o: &str| format!("sub:{o}");
    {
        let store = f.store();
        // A new store is at the current schema: nothing to do.
        assert_eq!(
            store.migrate_owners(SCHEMA_OWNER_KINDS, map).await.unwrap(),
            None
        );
        let r = record("alice", "w");
        store
            .insert_workload(&r, &grant("g", &r, 50), 20)
            .await
            .unwrap();
    }
    f.pretend_schema_v1().await;
    let store = f.store();
    let done = store.migrate_owners(SCHEMA_OWNER_KINDS, map).await.unwrap();
    assert_eq!(
        done,
        Some(OwnerMigration {
            from_version: 1,
            workloads: 1,
            grants: 1
        })
    );
    assert!(store.workload("alice", "w").await.unwrap().is_none());
    let migrated = store.workload("sub:alice", "w").await.unwrap().unwrap();
    assert_eq!(
        (migrated.owner.as_str(), migrated.version),
        ("sub:alice", 1)
    );
    assert_eq!(store.grant("g").await.unwrap().unwrap().owner, "sub:alice");
    // Again, or on another replica: nothing prefixed twice.
    assert_eq!(
        store.migrate_owners(SCHEMA_OWNER_KINDS, map).await.unwrap(),
        None
    );
    assert_eq!(
        f.replica()
            .migrate_owners(SCHEMA_OWNER_KINDS, map)
            .await
            .unwrap(),
        None
    );
    assert_eq!(names(&*store, "sub:alice").await, ["sub:alice:w"]);
}

fn run(owner: &str, workload: &str, id: &str, sandboxes: &[&str]) -> RunRecord {
    RunRecord {
        owner: owner.into(),
        workload: workload.into(),
        run_id: id.into(),
        revision: "r".repeat(64),
        scope: "s".repeat(32),
        sandboxes: sandboxes
            .iter()
            .map(|s| RunSandbox {
                sandbox: (*s).into(),
                pod: None,
                root: ".context".into(),
                path: format!("/x/{s}/{id}"),
            })
            .collect(),
        created_at_ms: 1,
    }
}

async fn runs_merge_conflict_and_shrink(f: &mut dyn Fixture) {
    let runs = f.runs();
    runs.add_to_run(&run("o", "w", "a", &["s2"])).await.unwrap();
    let merged = runs
        .add_to_run(&run("o", "w", "a", &["s1", "s2"]))
        .await
        .unwrap();
    let sandboxes: Vec<_> = merged
        .sandboxes
        .iter()
        .map(|s| s.sandbox.as_str())
        .collect();
    assert_eq!(sandboxes, ["s1", "s2"]);
    assert_eq!(runs.run("o", "w", "a").await.unwrap(), Some(merged));
    let mut other = run("o", "w", "a", &["s3"]);
    other.revision = "q".repeat(64);
    assert!(matches!(
        runs.add_to_run(&other).await,
        Err(StoreError::Conflict)
    ));
    // The same run id for another owner or workload: separate runs.
    runs.add_to_run(&run("o2", "w", "a", &["s1"]))
        .await
        .unwrap();
    runs.add_to_run(&run("o", "w2", "a", &["s1"]))
        .await
        .unwrap();
    runs.add_to_run(&run("o", "w", "b", &["s1"])).await.unwrap();
    let ids: Vec<_> = runs
        .runs_of("o", "w")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let left = runs
        .remove_from_run("o", "w", "a", &["s1".into()])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(left.sandboxes.len(), 1);
    assert!(runs
        .remove_from_run("o", "w", "a", &["s2".into()])
        .await
        .unwrap()
        .is_none());
    assert!(runs.run("o", "w", "a").await.unwrap().is_none());
    assert!(runs.run("o2", "w", "a").await.unwrap().is_some());
    assert!(runs
        .remove_from_run("o", "w", "zz", &[])
        .await
        .unwrap()
        .is_none());
}

macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod redb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::$test(&mut super::Redb::new()).await;
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                super::$test(&mut super::Postgres::new().await).await;
            })*
        }
    };
}

conformance!(
    insert_name_taken_and_quota,
    quota_holds_across_replicas,
    replace_is_compare_and_swap,
    grant_is_consumed_exactly_once_across_replicas,
    no_update_is_lost_across_replicas,
    remove_takes_its_grants,
    expired_grants_are_purged,
    owners_migrate_once,
    runs_merge_conflict_and_shrink,
);

/// Replicas starting together on a new database: each finds the schema
/// ready, the migrations are recorded once, and a restart applies none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_migrations_are_idempotent_under_concurrent_starts() {
    let cluster = Cluster::shared();
    let url = cluster.create_database();
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (url, barrier) = (url.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                PostgresStore::connect(&url).await.map(|_| ())
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let db = url.expose().rsplit('/').next().unwrap();
    assert_eq!(
        cluster.psql(
            db,
            "SELECT string_agg(version::text, ',') FROM cs_schema_migrations"
        ),
        "1"
    );
    let store = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_OWNER_KINDS);
    // A database migrated by a newer build is refused, not guessed at.
    cluster.psql(
        db,
        "INSERT INTO cs_schema_migrations (version, name) VALUES (99, 'future')",
    );
    match PostgresStore::connect(&url).await {
        Err(StoreError::Database(m)) => assert!(m.contains("version 99"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Records are the embedded store's JSON, byte for byte, so they can be
/// copied between the two.
#[tokio::test]
async fn postgres_records_are_the_embedded_encoding() {
    let fixture = Postgres::new().await;
    let r = record("o", "w");
    fixture
        .store
        .insert_workload(&r, &grant("g", &r, 10), 20)
        .await
        .unwrap();
    let stored = fixture.store.workload("o", "w").await.unwrap().unwrap();
    let hex = Cluster::shared().psql(
        &fixture.db,
        "SELECT encode(record, 'hex') FROM cs_workloads WHERE owner = 'o' AND name = 'w'",
    );
    assert_eq!(hex, hex::encode(serde_json::to_vec(&stored).unwrap()));
}
