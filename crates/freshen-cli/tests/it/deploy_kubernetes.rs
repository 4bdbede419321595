//! `deploy/kubernetes/`, checked with real tools: `kubernetes-validate` (PyPI, pinned, in
//! `target/test-venv-k8s`: `scripts/test-deps-k8s`) against the Kubernetes schemas, the
//! ConfigMap's `freshen.toml` through `freshen check --offline` with the Secret's
//! variables, the parts that must agree (names, ports, paths, labels), and the probes'
//! paths asked of a real active and a real standby freshen, before and after a takeover.

use crate::deploy::{ok, repo, run};
use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use freshen_testenv::refresher::eventually;
use serde_json::Value;

const DIR: &str = "deploy/kubernetes";

/// The virtualenv `scripts/test-deps-k8s` makes: `$FRESHEN_K8S_VENV`, else
/// `target/test-venv-k8s` in the workspace.
fn venv() -> PathBuf {
    std::env::var_os("FRESHEN_K8S_VENV")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/test-venv-k8s"))
}

/// A program of the virtualenv; panics saying how to install it when it is missing.
fn tool(name: &str) -> PathBuf {
    let path = venv().join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test-deps-k8s (kubernetes-validate from PyPI)",
        path.display()
    );
    path
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join(DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every document of every manifest, as JSON (PyYAML, the validator's own parser).
fn documents() -> Vec<Value> {
    let out = ok(Command::new(tool("python"))
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))",
        ])
        .args(manifests()));
    serde_json::from_str(&out).unwrap()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut of = docs.iter().filter(|d| d["kind"] == kind);
    let one = of.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(of.next().is_none(), "more than one {kind}");
    one
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let validate = tool("kubernetes-validate");
    let files = manifests();
    let names: BTreeSet<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "configmap.yaml",
        "deployment.yaml",
        "pdb.yaml",
        "secret.yaml",
    ] {
        assert!(names.contains(want), "{DIR} has no {want}: {names:?}");
    }
    // The newest schemas the tool knows, and an older release still in wide use.
    for version in [None, Some("1.29")] {
        let mut cmd = Command::new(&validate);
        cmd.args(["--strict", "--quiet"]);
        if let Some(v) = version {
            cmd.args(["-k", v]);
        }
        let out = run(cmd.args(&files));
        assert!(
            out.status.success(),
            "{version:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Strict: a misspelt field is refused, not ignored.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("pdb.yaml");
    let text = std::fs::read_to_string(repo().join(DIR).join("pdb.yaml")).unwrap();
    std::fs::write(&bad, text.replace("maxUnavailable:", "maxUnavailabel:")).unwrap();
    let out = run(Command::new(&validate)
        .args(["--strict", "--quiet"])
        .arg(&bad));
    assert!(!out.status.success(), "{out:?}");
}

#[test]
fn the_configmaps_configuration_passes_freshen_check_with_the_secrets_variables() {
    let docs = documents();
    let config = kind(&docs, "ConfigMap")["data"]["freshen.toml"]
        .as_str()
        .expect("the ConfigMap holds freshen.toml")
        .to_owned();
    let secret = kind(&docs, "Secret")["stringData"]
        .as_object()
        .expect("the Secret's stringData")
        .clone();
    // Every ${VAR} the file names is a key of the Secret (envFrom makes it a variable).
    let mut rest = config.as_str();
    while let Some(at) = rest.find("${") {
        let var = &rest[at + 2..];
        let end = var.find('}').unwrap();
        assert!(
            secret.contains_key(&var[..end]),
            "${{{}}} is not in the Secret",
            &var[..end]
        );
        rest = &var[end..];
    }
    let check = |text: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = support::write_config(dir.path(), text);
        let mut cmd = support::freshen();
        cmd.args(["check", "--offline", "-c"]).arg(&path);
        cmd.env_remove("DATABASE_URL");
        for (k, v) in &secret {
            cmd.env(k, v.as_str().unwrap());
        }
        run(&mut cmd)
    };
    let out = check(&config);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{out:?}");
    assert!(said.contains("0 error(s)"), "{said}");
    // The check reads what it is given: a misspelt key fails, named.
    let out = check(&config.replace("slot = ", "slots = "));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("slots"), "{said}");
}

#[test]
fn the_deployment_the_configmap_the_secret_and_the_budget_agree() {
    let docs = documents();
    let deployment = kind(&docs, "Deployment");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2);
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    let [container] = pod["containers"].as_array().unwrap().as_slice() else {
        panic!("one container");
    };

    // The configuration is the ConfigMap's file, at the path the container reads.
    let config_map = kind(&docs, "ConfigMap");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["configMap"]["name"] == config_map["metadata"]["name"])
        .expect("a volume of the ConfigMap");
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the ConfigMap mounted");
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let file = format!("{}/freshen.toml", mount["mountPath"].as_str().unwrap());
    assert_eq!(args, ["run", "-c", file.as_str()]);
    // Secrets come from the Secret.
    let secret = kind(&docs, "Secret");
    assert!(
        container["envFrom"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["secretRef"]["name"] == secret["metadata"]["name"]),
        "{container}"
    );
    // The probes ask the port the file listens on, on every interface.
    let config = config_map["data"]["freshen.toml"].as_str().unwrap();
    let port = container["ports"][0]["containerPort"].as_u64().unwrap();
    assert!(
        config.contains(&format!("listen = \"0.0.0.0:{port}\"")),
        "{config}"
    );
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], "/status", "{probe}: see deploy/README.md");
        assert_eq!(get["port"], container["ports"][0]["name"], "{probe}");
    }
    // Sized from BENCHMARKS.md, non-root as the image is, and given time to stop.
    let resources = &container["resources"];
    assert!(
        resources["requests"]["memory"].is_string() && resources["requests"]["cpu"].is_string()
    );
    assert!(resources["limits"]["memory"].is_string());
    assert_eq!(pod["securityContext"]["runAsUser"], 10001);
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 10);

    // The budget covers these pods and lets one go at a time.
    let pdb = kind(&docs, "PodDisruptionBudget");
    let selector = pdb["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(&labels[k], v, "the budget's selector {k}");
    }
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
}

/// What a probe of `path` sees: the status code of `GET path`.
async fn probe(base: &str, path: &str) -> u16 {
    freshen_cli::status::get(base, path)
        .await
        .map_or(0, |(code, _)| code)
}

/// The ConfigMap's file, run twice on one database: the probes' path answers 200 in the
/// active and in the standby (both stay Ready, neither is restarted), while `/healthz`
/// tells them apart; after the active is killed the standby takes over and its probes
/// keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_keep_both_the_active_and_the_standby_up_across_a_takeover() {
    let docs = documents();
    let config = kind(&docs, "ConfigMap")["data"]["freshen.toml"]
        .as_str()
        .unwrap()
        .to_owned();
    let secret = kind(&docs, "Secret")["stringData"].clone();
    let container = &kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let paths: BTreeSet<String> = ["startupProbe", "livenessProbe", "readinessProbe"]
        .iter()
        .map(|p| {
            container[*p]["httpGet"]["path"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();

    let pg = support::start_pg();
    let c = support::connect(&pg.url()).await;
    c.batch_execute(support::SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The Secret's variables written in, as the container's environment would give them.
    let token = secret["FRESHEN_ADMIN_TOKEN"].as_str().unwrap();
    let spawn = |n: u32| {
        let port = support::free_port();
        let text = config
            .replace("0.0.0.0:9187", &format!("127.0.0.1:{port}"))
            .replace("${DATABASE_URL}", &pg.url())
            .replace("${FRESHEN_ADMIN_TOKEN}", token);
        let path = dir.path().join(format!("freshen-{n}.toml"));
        std::fs::write(&path, text).unwrap();
        (
            support::spawn_run(dir.path(), &path, n),
            format!("http://127.0.0.1:{port}"),
        )
    };
    let (mut active, a) = spawn(1);
    support::wait_healthy(&a, dir.path(), 1, Duration::from_secs(60)).await;
    let (_standby, b) = spawn(2);
    let (a, b) = (&a, &b);
    eventually(60, "the second process reports standby", || async move {
        let s = freshen_cli::status::fetch(b).await.ok()?;
        (s.role == "standby").then_some(())
    })
    .await;
    for path in &paths {
        assert_eq!(probe(a, path).await, 200, "active {path}");
        assert_eq!(probe(b, path).await, 200, "standby {path}");
    }
    // /healthz would fail the standby's probes (and restart it, as a liveness probe).
    assert_eq!(probe(a, "/healthz").await, 200);
    assert_eq!(probe(b, "/healthz").await, 503);

    active.kill().unwrap();
    active.wait().unwrap();
    support::wait_healthy(b, dir.path(), 2, Duration::from_secs(60)).await;
    for path in &paths {
        assert_eq!(probe(b, path).await, 200, "taken over: {path}");
    }
}
