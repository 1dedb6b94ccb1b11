//! The local backend against a temporary directory: rollback, crash
//! recovery, conflicts, ownership of existing volumes, concurrency.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::records::{PoolRecord, RecordState};
use super::{LocalBackend, LocalSettings};
use crate::pool::model::{
    AccessMode, ContextVolumeSpec, ContextVolumeType, PoolPhase, PoolSpec, Strategy,
};
use crate::pool::{BackendError, SandboxBackend};

fn open(dir: &Path) -> LocalBackend {
    LocalBackend::open(LocalSettings {
        root: dir.join("local"),
        namespace: "default".into(),
        warm_pools: vec!["agents".into()],
    })
    .unwrap()
}

fn spec(name: &str, replicas: u32, strategy: Strategy) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        replicas,
        strategy,
        expires_at: None,
        owner_scope: "owner-a".into(),
    }
}

fn dedicated() -> Strategy {
    Strategy::Dedicated {
        size: "1Gi".into(),
        storage_class: None,
    }
}

/// Every file and directory under the namespace tree, relative.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                walk(base, &p, out);
            }
        }
    }
    let base = dir.join("local/namespaces/default");
    let mut out = Vec::new();
    walk(&base, &base, &mut out);
    out.retain(|p| p.contains('/'));
    out.sort();
    out
}

#[tokio::test]
async fn failure_half_way_rolls_back_everything() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    backend.fail_on(Some("sandbox-p-1"));
    let err = backend
        .create_pool(&spec("p", 3, dedicated()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("create sandbox 1"), "{err}");
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
    assert!(backend.get_pool("p").await.unwrap().is_none());
    // The name is free again.
    backend.fail_on(None);
    let status = backend
        .create_pool(&spec("p", 3, dedicated()))
        .await
        .unwrap();
    assert_eq!(status.phase, PoolPhase::Ready);
    assert_eq!(status.ready_replicas, 3);
}

#[tokio::test]
async fn warm_claim_failure_rolls_back_adopted_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    backend.fail_on(Some("claim-w-2"));
    let warm = Strategy::Warm {
        pool: "agents".into(),
    };
    backend.create_pool(&spec("w", 3, warm)).await.unwrap_err();
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
}

#[tokio::test]
async fn a_crash_mid_create_is_rolled_back_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    let s = spec("p", 2, dedicated());
    backend.create_pool(&s).await.unwrap();
    // Simulate a crash: the record says "creating" and objects exist.
    backend
        .inner
        .write_record(&PoolRecord {
            spec: s.clone(),
            state: RecordState::Creating,
        })
        .unwrap();
    assert_eq!(
        backend.get_pool("p").await.unwrap().unwrap().phase,
        PoolPhase::Provisioning
    );
    drop(backend);
    let backend = open(dir.path());
    assert!(backend.get_pool("p").await.unwrap().is_none());
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
}

#[tokio::test]
async fn conflicts_are_detected_across_strategies() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    backend
        .create_pool(&spec("p", 1, dedicated()))
        .await
        .unwrap();
    let warm = Strategy::Warm {
        pool: "agents".into(),
    };
    for strategy in [
        warm,
        Strategy::Shared {
            size: "1Gi".into(),
            storage_class: None,
        },
        dedicated(),
    ] {
        let err = backend
            .create_pool(&spec("p", 2, strategy))
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::AlreadyExists), "{err}");
    }
    // A record lost (e.g. deleted by hand) still conflicts on objects.
    fs::remove_file(backend.inner.record_path("p")).unwrap();
    let err = backend
        .create_pool(&spec(
            "p",
            1,
            Strategy::Warm {
                pool: "agents".into(),
            },
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::AlreadyExists), "{err}");
}

#[tokio::test]
async fn delete_keeps_existing_volumes_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    let ctx = ContextVolumeSpec {
        name: "shared".into(),
        namespace: "default".into(),
        context_type: ContextVolumeType::Workspace,
        size: "2Gi".into(),
        access_mode: AccessMode::ReadWriteMany,
        storage_class: None,
        owner_scope: "owner-a".into(),
    };
    backend.create_volume(&ctx).await.unwrap();
    let existing = Strategy::Existing {
        claim_name: "context-shared".into(),
        read_only: true,
    };
    let status = backend.create_pool(&spec("e", 2, existing)).await.unwrap();
    assert_eq!(status.workspace.size, "2Gi");
    assert_eq!(status.workspace.access_mode, "ReadWriteMany");
    assert!(backend.delete_pool("e").await.unwrap());
    assert!(!backend.delete_pool("e").await.unwrap());
    assert!(backend
        .get_volume("default", "shared")
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        tree(dir.path()),
        vec![
            "volumes/context-shared",
            "volumes/context-shared/data",
            "volumes/context-shared/volume.json"
        ]
    );
}

#[tokio::test]
async fn another_owners_volume_is_not_found_and_rwo_needs_one_replica() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    let ctx = ContextVolumeSpec {
        name: "mine".into(),
        namespace: "default".into(),
        context_type: ContextVolumeType::Memory,
        size: "1Gi".into(),
        access_mode: AccessMode::ReadWriteOnce,
        storage_class: Some("fast".into()),
        owner_scope: "owner-b".into(),
    };
    backend.create_volume(&ctx).await.unwrap();
    let existing = |read_only| Strategy::Existing {
        claim_name: "context-mine".into(),
        read_only,
    };
    let err = backend
        .create_pool(&spec("e", 1, existing(false)))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid sandbox pool: workspace claim \"context-mine\" not found"
    );
    let mut theirs = spec("e", 2, existing(false));
    theirs.owner_scope = "owner-b".into();
    let err = backend.create_pool(&theirs).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid sandbox pool: workspace claim \"context-mine\" must support ReadWriteMany for multiple sandboxes"
    );
    theirs.replicas = 1;
    let status = backend.create_pool(&theirs).await.unwrap();
    assert_eq!(status.workspace.storage_class.as_deref(), Some("fast"));
}

#[tokio::test]
async fn a_sandbox_removed_behind_our_back_fails_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    backend
        .create_pool(&spec("p", 2, dedicated()))
        .await
        .unwrap();
    fs::remove_dir_all(backend.inner.sandbox_dir("sandbox-p-1")).unwrap();
    let status = backend.get_pool("p").await.unwrap().unwrap();
    assert_eq!(status.phase, PoolPhase::Failed);
    assert_eq!(status.ready_replicas, 1);
    assert_eq!(status.reason.as_deref(), Some("SandboxMissing"));
    assert!(status.message.unwrap().contains("sandbox-p-1"));
    assert!(!status.members[1].ready && status.members[0].ready);
    // Delete still cleans up what is left.
    assert!(backend.delete_pool("p").await.unwrap());
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
}

#[tokio::test]
async fn wait_returns_at_once_when_settled_and_none_when_missing() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    assert!(backend
        .wait_pool("nope", Duration::from_secs(5))
        .await
        .unwrap()
        .is_none());
    backend
        .create_pool(&spec("p", 1, dedicated()))
        .await
        .unwrap();
    let status = backend
        .wait_pool("p", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.phase, PoolPhase::Ready);
}

#[tokio::test]
async fn a_half_made_context_volume_does_not_block_creation() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    fs::create_dir_all(backend.inner.volume_dir("team", "context-notes")).unwrap();
    let ctx = ContextVolumeSpec {
        name: "notes".into(),
        namespace: "team".into(),
        context_type: ContextVolumeType::Memory,
        size: "1Gi".into(),
        access_mode: AccessMode::ReadWriteOnce,
        storage_class: None,
        owner_scope: "owner-a".into(),
    };
    assert!(backend.get_volume("team", "notes").await.unwrap().is_none());
    let status = backend.create_volume(&ctx).await.unwrap();
    assert_eq!(status.claim_name, "context-notes");
    let err = backend.create_volume(&ctx).await.unwrap_err();
    assert!(matches!(err, BackendError::AlreadyExists), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_and_deletes_of_many_pools() {
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    let mut tasks = Vec::new();
    for i in 0..12 {
        let backend = backend.clone();
        let strategy = match i % 3 {
            0 => dedicated(),
            1 => Strategy::Shared {
                size: "1Gi".into(),
                storage_class: None,
            },
            _ => Strategy::Warm {
                pool: "agents".into(),
            },
        };
        tasks.push(tokio::spawn(async move {
            backend
                .create_pool(&spec(&format!("p{i}"), 5, strategy))
                .await
        }));
    }
    for t in tasks {
        let status = t.await.unwrap().unwrap();
        assert_eq!((status.phase, status.ready_replicas), (PoolPhase::Ready, 5));
    }
    assert_eq!(backend.list_pools().await.unwrap().len(), 12);
    let mut tasks = Vec::new();
    for i in 0..12 {
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move {
            backend.delete_pool(&format!("p{i}")).await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().unwrap());
    }
    assert!(tree(dir.path()).is_empty(), "{:?}", tree(dir.path()));
}

#[tokio::test]
async fn suspended_sandboxes_keep_their_files_and_refuse_exec() {
    use crate::delivery::{ExecError, ExecTarget, SandboxExec};
    let dir = tempfile::tempdir().unwrap();
    let backend = open(dir.path());
    backend
        .create_pool(&spec("p", 2, dedicated()))
        .await
        .unwrap();
    let before = tree(dir.path());
    assert!(backend.set_suspended("none", true).await.unwrap().is_none());
    let status = backend.set_suspended("p", true).await.unwrap().unwrap();
    assert_eq!(status.phase, PoolPhase::Suspended);
    assert_eq!(status.ready_replicas, 0);
    assert_eq!(tree(dir.path()), before, "nothing is removed");
    let target = ExecTarget {
        sandbox: "sandbox-p-1".into(),
        pod: None,
    };
    let argv = ["true".to_owned()];
    match backend.exec(&target, &argv).await {
        Err(ExecError::Suspended(name)) => assert_eq!(name, "sandbox-p-1"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("exec ran in a suspended sandbox"),
    }
    // Reopened (a restart), still suspended.
    let backend = open(dir.path());
    let status = backend.get_pool("p").await.unwrap().unwrap();
    assert_eq!(status.phase, PoolPhase::Suspended);
    let status = backend.set_suspended("p", false).await.unwrap().unwrap();
    assert_eq!(status.phase, PoolPhase::Ready);
    assert_eq!(status.ready_replicas, 2);
    let session = backend.exec(&target, &argv).await.unwrap();
    assert_eq!(session.done.await.unwrap(), 0);
}
