//! The transactions themselves, synchronously; the async face is
//! covered by the store conformance tests.
use super::*;
use crate::store::WorkloadStatus;

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

#[test]
fn owners_never_see_each_others_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("m.redb")).unwrap().tables;
    // "a" + "b/x" must not collide with "a/b" + "x" or prefix-match "ab".
    for (owner, name) in [("a", "x"), ("ab", "x"), ("a/b", "x"), ("b", "y")] {
        let r = record(owner, name);
        store
            .insert_workload(&r, &grant(&format!("g{owner}{name}"), &r, 10), 20)
            .unwrap();
    }
    let names = |o: &str| -> Vec<String> {
        store
            .workloads_of(o)
            .unwrap()
            .into_iter()
            .map(|r| format!("{}:{}", r.owner, r.name))
            .collect()
    };
    assert_eq!(names("a"), vec!["a:x"]);
    assert_eq!(names("ab"), vec!["ab:x"]);
    assert_eq!(names("a/b"), vec!["a/b:x"]);
    assert_eq!(store.all_workloads().unwrap().len(), 4);
    assert!(store.workload("a", "y").unwrap().is_none());
}

#[test]
fn quota_name_and_compare_and_swap() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("m.redb")).unwrap().tables;
    let r1 = record("o", "one");
    store
        .insert_workload(&r1, &grant("g1", &r1, 10), 2)
        .unwrap();
    assert!(matches!(
        store.insert_workload(&r1, &grant("g1b", &r1, 10), 2),
        Err(StoreError::NameTaken)
    ));
    let r2 = record("o", "two");
    store
        .insert_workload(&r2, &grant("g2", &r2, 10), 2)
        .unwrap();
    let r3 = record("o", "three");
    assert!(matches!(
        store.insert_workload(&r3, &grant("g3", &r3, 10), 2),
        Err(StoreError::QuotaExceeded(2))
    ));
    let current = store.workload("o", "one").unwrap().unwrap();
    assert_eq!(current.version, 1);
    let next = store.replace_workload(&current, Some("g1")).unwrap();
    assert_eq!(next.version, 2);
    // Stale version and used grant are both refused.
    assert!(matches!(
        store.replace_workload(&current, None),
        Err(StoreError::Conflict)
    ));
    assert!(matches!(
        store.replace_workload(&next, Some("g1")),
        Err(StoreError::GrantUsed)
    ));
    store.remove_workload("o", "two", 1).unwrap();
    assert!(store.grant("g2").unwrap().is_none(), "grants go with it");
    assert!(store.workload("o", "two").unwrap().is_none());
}

#[test]
fn owners_migrate_once_with_their_keys_and_grants() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let store = RedbStore::open(&path).unwrap().tables;
        assert_eq!(store.schema_version().unwrap(), SCHEMA_OWNER_KINDS);
        // Pretend a version-1 store: bare owners, no version recorded.
        let r = record("alice", "w");
        store.insert_workload(&r, &grant("g", &r, 50), 20).unwrap();
        let txn = store.db.begin_write().unwrap();
        txn.open_table(META).unwrap().remove(SCHEMA_KEY).unwrap();
        txn.commit().unwrap();
    }
    let store = RedbStore::open(&path).unwrap().tables;
    assert_eq!(store.schema_version().unwrap(), 1);
    let map = |o: &str| format!("sub:{o}");
    let done = store.migrate_owners(SCHEMA_OWNER_KINDS, map).unwrap();
    assert_eq!(
        done,
        Some(OwnerMigration {
            from_version: 1,
            workloads: 1,
            grants: 1
        })
    );
    assert!(store.workload("alice", "w").unwrap().is_none());
    let migrated = store.workload("sub:alice", "w").unwrap().unwrap();
    assert_eq!(
        (migrated.owner.as_str(), migrated.version),
        ("sub:alice", 1)
    );
    assert_eq!(store.grant("g").unwrap().unwrap().owner, "sub:alice");
    // Again: nothing to do, nothing prefixed twice.
    assert_eq!(store.migrate_owners(SCHEMA_OWNER_KINDS, map).unwrap(), None);
    assert_eq!(store.workloads_of("sub:alice").unwrap().len(), 1);
    assert_eq!(store.schema_version().unwrap(), SCHEMA_OWNER_KINDS);
}

#[test]
fn expired_grants_are_purged_and_data_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let store = RedbStore::open(&path).unwrap().tables;
        let r = record("o", "w");
        store.insert_workload(&r, &grant("old", &r, 5), 20).unwrap();
        store.insert_grant(&grant("new", &r, 50)).unwrap();
        assert_eq!(store.purge_expired_grants(10).unwrap(), 1);
    }
    let store = RedbStore::open(&path).unwrap().tables;
    assert!(store.grant("old").unwrap().is_none());
    assert!(store.grant("new").unwrap().is_some());
    assert_eq!(store.workload("o", "w").unwrap().unwrap().version, 1);
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
            .map(|s| crate::store::RunSandbox {
                sandbox: (*s).into(),
                pod: None,
                root: ".context".into(),
                path: format!("/x/{s}/{id}"),
            })
            .collect(),
        created_at_ms: 1,
    }
}

#[test]
fn runs_merge_conflict_shrink_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let store = RedbStore::open(&path).unwrap().tables;
        store.add_to_run(&run("o", "w", "a", &["s2"])).unwrap();
        let merged = store
            .add_to_run(&run("o", "w", "a", &["s1", "s2"]))
            .unwrap();
        let names: Vec<_> = merged
            .sandboxes
            .iter()
            .map(|s| s.sandbox.as_str())
            .collect();
        assert_eq!(names, ["s1", "s2"]);
        let mut other = run("o", "w", "a", &["s3"]);
        other.revision = "q".repeat(64);
        assert!(matches!(
            store.add_to_run(&other),
            Err(StoreError::Conflict)
        ));
        // Same run id for another owner or workload: separate runs.
        store.add_to_run(&run("o2", "w", "a", &["s1"])).unwrap();
        store.add_to_run(&run("o", "w2", "a", &["s1"])).unwrap();
        store.add_to_run(&run("o", "w", "b", &["s1"])).unwrap();
    }
    let store = RedbStore::open(&path).unwrap().tables;
    let ids: Vec<_> = store
        .runs_of("o", "w")
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let left = store
        .remove_from_run("o", "w", "a", &["s1".into()])
        .unwrap()
        .unwrap();
    assert_eq!(left.sandboxes.len(), 1);
    assert!(store
        .remove_from_run("o", "w", "a", &["s2".into()])
        .unwrap()
        .is_none());
    assert!(store.run("o", "w", "a").unwrap().is_none());
    assert!(store.run("o2", "w", "a").unwrap().is_some());
    assert!(store
        .remove_from_run("o", "w", "zz", &[])
        .unwrap()
        .is_none());
}
