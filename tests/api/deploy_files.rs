//! The settings files and Kubernetes manifests, checked against the code:
//! `.env.example` lists every setting of `context-service serve` with its
//! default (read from clap's definition), the ConfigMap sets every setting
//! the cluster needs with values `serve` accepts, and the StatefulSet has
//! the probes, resources and hardening an operator expects. (Rendering and a
//! server-side dry run against a real API server: tests/k8s/deploy-check.sh.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use clap::{CommandFactory, Parser};
use context_service::config::ServeConfig;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    config: ServeConfig,
}

/// One setting of `serve`: its variable, long flag and default ("" if none).
struct Setting {
    env: String,
    long: String,
    default: String,
}

fn settings() -> Vec<Setting> {
    Serve::command()
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_str()?.to_owned();
            let default = a
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",");
            Some(Setting {
                env,
                long: a.get_long()?.to_owned(),
                default,
            })
        })
        .collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every YAML document of `path`.
fn documents(path: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn document(path: &str, kind: &str) -> Value {
    documents(path)
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {path}"))
}

#[test]
fn env_example_lists_every_setting_with_its_default() {
    let settings = settings();
    assert!(settings.len() >= 20, "found {} settings", settings.len());
    let text = read(".env.example");
    let listed: BTreeMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.trim_start_matches('#').trim().split_once('='))
        .filter(|(k, _)| k.starts_with("CS_") || k.starts_with("CONTEXT_SERVICE_"))
        .collect();
    let mut missing = Vec::new();
    for s in &settings {
        match listed.get(s.env.as_str()) {
            None => missing.push(format!("{}={}  (--{})", s.env, s.default, s.long)),
            Some(v) => assert_eq!(*v, s.default, "{}: default of --{}", s.env, s.long),
        }
        assert!(
            text.contains(&format!("# --{}:", s.long)),
            "{}: say which flag it is (--{})",
            s.env,
            s.long
        );
    }
    assert!(
        missing.is_empty(),
        ".env.example misses settings of `serve`:\n{}",
        missing.join("\n")
    );
    // Nothing stale: every other variable is contextctl's.
    let known: BTreeSet<&str> = settings.iter().map(|s| s.env.as_str()).collect();
    let client = [
        "CONTEXT_SERVICE_URL",
        "CONTEXT_SERVICE_TOKEN",
        context_service::cli::pool::STORAGE_CLASS_ENV,
    ];
    for key in listed.keys() {
        assert!(
            known.contains(key) || client.contains(key),
            "{key} in .env.example is no setting"
        );
    }
}

#[test]
fn configmap_sets_every_setting_with_values_serve_accepts() {
    let cm = document("deploy/base/configmap.yaml", "ConfigMap");
    let data = cm["data"].as_object().expect("data");
    let sts = document("deploy/base/statefulset.yaml", "StatefulSet");
    let container = &sts["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["envFrom"][0]["configMapRef"]["name"], cm["metadata"]["name"],
        "the StatefulSet reads the ConfigMap"
    );
    let env: Vec<&str> = container["env"]
        .as_array()
        .map(|e| e.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    // Optional settings without a default cannot be empty: the ConfigMap
    // names them in its comments for when they are used.
    let comments = read("deploy/base/configmap.yaml");
    let mut args = vec!["serve".to_owned()];
    for s in settings() {
        if let Some(value) = data.get(&s.env) {
            let value = value
                .as_str()
                .unwrap_or_else(|| panic!("{}: a string", s.env));
            args.push(format!("--{}={value}", s.long));
        } else {
            assert!(
                env.contains(&s.env.as_str())
                    || (s.default.is_empty() && comments.contains(&format!("#   {}", s.env))),
                "{} is neither in the ConfigMap nor in the StatefulSet's env",
                s.env
            );
        }
    }
    for key in data.keys() {
        assert!(key.starts_with("CS_"), "{key}");
    }
    // The database URL carries a password: a Secret's, optional (without
    // it the embedded store is used), never the ConfigMap's.
    assert!(!data.contains_key("CS_DATABASE_URL"));
    let database = container["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "CS_DATABASE_URL"))
        .expect("CS_DATABASE_URL in the StatefulSet's env");
    let secret_ref = &database["valueFrom"]["secretKeyRef"];
    assert_eq!(secret_ref["name"], "context-service-database");
    assert_eq!(secret_ref["key"], "url");
    assert_eq!(
        secret_ref["optional"], true,
        "the embedded store needs no Secret"
    );
    // The values are ones `serve` accepts.
    let parsed = Serve::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(
        parsed.config.backend,
        context_service::config::BackendKind::Kube
    );
    // Kubernetes kills the pod after terminationGracePeriodSeconds: the
    // readiness grace and the drain must fit in it, with time to close the
    // store.
    let period = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    let shutdown = parsed.config.shutdown_grace + parsed.config.shutdown_timeout;
    assert!(
        std::time::Duration::from_secs(period) >= shutdown + std::time::Duration::from_secs(5),
        "terminationGracePeriodSeconds {period} leaves no room after {shutdown:?}"
    );
    // The JWKS named is a file of the mounted keys Secret.
    let jwks = parsed.config.jwks_file.expect("CS_JWKS_FILE");
    let secret = document("deploy/base/secret.yaml", "Secret");
    let keys_volume = sts["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|v| {
            v.iter()
                .find(|v| v["secret"]["secretName"] == secret["metadata"]["name"])
        })
        .expect("the keys Secret is a volume");
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["name"] == keys_volume["name"]))
        .expect("and mounted");
    let file = jwks
        .strip_prefix(mount["mountPath"].as_str().unwrap())
        .expect("CS_JWKS_FILE is under the Secret's mount");
    assert!(
        secret["stringData"].get(file.to_str().unwrap()).is_some(),
        "the Secret has {file:?}"
    );
    assert_eq!(
        parsed.config.data_dir,
        Path::new(
            container["volumeMounts"][0]["mountPath"]
                .as_str()
                .expect("data mount")
        ),
        "CS_DATA_DIR is the data volume"
    );
}

#[test]
fn statefulset_is_probed_bounded_and_hardened() {
    let sts = document("deploy/base/statefulset.yaml", "StatefulSet");
    let pod = &sts["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["startupProbe"]["httpGet"]["path"], "/healthz");
    for kind in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            assert!(c["resources"][kind][res].is_string(), "{kind}.{res}");
        }
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(sc["capabilities"].get("add").is_none());
    // The uid is the image's (Dockerfile: USER 65532).
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);

    // The NetworkPolicy selects these pods and restricts both directions.
    let np = document("deploy/base/networkpolicy.yaml", "NetworkPolicy");
    let labels = &sts["spec"]["template"]["metadata"]["labels"];
    for (k, v) in np["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(&labels[k], v, "podSelector {k}");
    }
    assert_eq!(
        np["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    let port = &c["ports"][0]["containerPort"];
    assert!(
        np["spec"]["ingress"][0]["ports"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| &p["port"] == port)),
        "ingress to the service port"
    );
    // Every file of the kustomization exists and is listed.
    let kustomization = document("deploy/base/kustomization.yaml", "Kustomization");
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(Path::new(ROOT).join("deploy/base"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, on_disk);
}

/// The JSON-patch operations of the HA overlay's patch on `kind`.
fn ha_patch_ops(kustomization: &Value, kind: &str) -> Vec<Value> {
    let patch = kustomization["patches"]
        .as_array()
        .expect("patches")
        .iter()
        .find(|p| p["target"]["kind"] == kind)
        .unwrap_or_else(|| panic!("no patch of the {kind}"));
    serde_saphyr::from_str(patch["patch"].as_str().expect("inline patch")).expect("JSON patch")
}

#[test]
fn ha_overlay_runs_the_base_pod_on_shared_stores() {
    let kustomization = document("deploy/overlays/ha/kustomization.yaml", "Kustomization");
    let sts = document("deploy/base/statefulset.yaml", "StatefulSet");
    let deploy = document("deploy/overlays/ha/deployment.yaml", "Deployment");
    let (base, ha) = (
        &sts["spec"]["template"]["spec"],
        &deploy["spec"]["template"]["spec"],
    );
    // The same hardened, probed, bounded pod as the StatefulSet.
    for key in [
        "serviceAccountName",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "terminationGracePeriodSeconds",
        "securityContext",
    ] {
        assert_eq!(ha[key], base[key], "pod {key}");
    }
    let (bc, hc) = (&base["containers"][0], &ha["containers"][0]);
    for key in [
        "name",
        "image",
        "args",
        "envFrom",
        "ports",
        "readinessProbe",
        "livenessProbe",
        "securityContext",
    ] {
        assert_eq!(hc[key], bc[key], "container {key}");
    }
    // The same CPU and memory; ephemeral storage differs (below).
    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert_eq!(
                hc["resources"][bound][resource], bc["resources"][bound][resource],
                "{bound}.{resource}"
            );
        }
    }
    assert_eq!(
        hc["startupProbe"]["httpGet"], bc["startupProbe"]["httpGet"],
        "startupProbe"
    );

    // Several replicas, never fewer than the ones serving during a rollout,
    // and one kept through a drain.
    assert!(deploy["spec"]["replicas"].as_u64() >= Some(2));
    assert_eq!(
        deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let pdb = document(
        "deploy/overlays/ha/poddisruptionbudget.yaml",
        "PodDisruptionBudget",
    );
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        deploy["spec"]["selector"]["matchLabels"],
        sts["spec"]["selector"]["matchLabels"]
    );

    // No volume of its own: the data dir is a cache.
    assert!(deploy["spec"].get("volumeClaimTemplates").is_none());
    let volumes = ha["volumes"].as_array().expect("volumes");
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    assert!(volume("data")["emptyDir"].is_object());
    // The emptyDirs are the pod's ephemeral storage: its limit holds them,
    // and the data dir holds the bounded disk copies and the upload spool.
    let size_limit = |name: &str| bytes_of(&volume(name)["emptyDir"]["sizeLimit"]);
    let (data, tmp) = (size_limit("data"), size_limit("tmp"));
    let ephemeral = bytes_of(&hc["resources"]["limits"]["ephemeral-storage"]);
    assert!(
        ephemeral >= data + tmp,
        "ephemeral-storage {ephemeral} < {data} + {tmp}"
    );
    let env_value = |var: &str| -> u64 {
        let entries = hc["env"].as_array().expect("env");
        let entry = entries.iter().find(|e| e["name"] == var);
        let value = match entry {
            Some(e) => e["value"].as_str().map(str::to_owned),
            None => document("deploy/base/configmap.yaml", "ConfigMap")["data"][var]
                .as_str()
                .map(str::to_owned),
        };
        value.unwrap_or_else(|| panic!("no {var}")).parse().unwrap()
    };
    let copies = env_value("CS_BLOB_LOCAL_MAX_BYTES");
    let spool = env_value("CS_UPLOAD_TEMP_MAX_BYTES");
    assert!(
        copies + spool < data,
        "copies {copies} + spool {spool} >= data {data}"
    );

    // Secrets hold what must not be in the ConfigMap, required (no
    // `optional`: a replica without them must not start on its own store).
    let env = hc["env"].as_array().expect("env");
    let from_secret = |var: &str| {
        let entry = env
            .iter()
            .find(|e| e["name"] == var)
            .unwrap_or_else(|| panic!("no {var}"));
        let key = &entry["valueFrom"]["secretKeyRef"];
        assert!(key.get("optional").is_none(), "{var} is optional");
        (
            key["name"].as_str().unwrap().to_owned(),
            key["key"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(
        from_secret("CS_DATABASE_URL"),
        ("context-service-database".into(), "url".into())
    );
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        assert_eq!(from_secret(var).0, "context-service-object-store");
    }

    // The ConfigMap names the bucket and the shared owner-scope key, whose
    // file is in the mounted Secret.
    let ops = ha_patch_ops(&kustomization, "ConfigMap");
    let value = |var: &str| {
        ops.iter()
            .find(|op| op["path"] == format!("/data/{var}"))
            .and_then(|op| op["value"].as_str())
            .unwrap_or_else(|| panic!("the ConfigMap patch sets no {var}"))
            .to_owned()
    };
    assert!(value("CS_BLOB_URL").starts_with("s3://"));
    let key_file = value("CS_OWNER_SCOPE_SECRET_FILE");
    let key_dir = Path::new(&key_file).parent().unwrap();
    let mount = hc["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == key_dir)
        .unwrap_or_else(|| panic!("nothing mounted at {}", key_dir.display()));
    assert_eq!(mount["readOnly"], true);
    let secret = &volume(mount["name"].as_str().unwrap())["secret"];
    assert_eq!(secret["secretName"], "context-service-owner-scope");
    // The key's file name is the Secret's key the docs create.
    assert_eq!(Path::new(&key_file).file_name().unwrap(), "key");

    // PostgreSQL's port is let out.
    let ops = ha_patch_ops(&kustomization, "NetworkPolicy");
    assert!(ops.iter().any(|op| op["value"]["port"] == 5432), "{ops:?}");
}

/// A Kubernetes quantity of bytes with a binary suffix (`10Gi`, `64Mi`).
fn bytes_of(quantity: &Value) -> u64 {
    let text = quantity.as_str().expect("a quantity string");
    let (number, shift) = match text {
        t if t.ends_with("Gi") => (&t[..t.len() - 2], 30),
        t if t.ends_with("Mi") => (&t[..t.len() - 2], 20),
        t if t.ends_with("Ki") => (&t[..t.len() - 2], 10),
        t => (t, 0),
    };
    number.parse::<u64>().expect("an integer quantity") << shift
}
