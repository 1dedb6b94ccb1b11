//! Unit tests of the rendered scripts' values and the protocol line parser.

use super::*;

fn req() -> DeliverRequest {
    DeliverRequest {
        root: DEFAULT_ROOT.into(),
        scope: "0123456789abcdef0123456789abcdef".into(),
        workload: "wl-1".into(),
        run_id: "run.1".into(),
        revision: "a".repeat(64),
        bundle_digest: "b".repeat(64),
        bundle_bytes: 10,
        inflated_bytes: 20,
        entries: 3,
        manifest: TreeManifest {
            names: "c".repeat(64),
            modes: "d".repeat(64),
            content: "e".repeat(64),
        },
        verify: Verify::Full,
    }
}

#[test]
fn manifest_digests_are_checked() {
    let mut r = req();
    r.manifest.modes = "D".repeat(64);
    assert_eq!(render_deliver(&r).unwrap_err().field(), "manifest.modes");
    let s = render_deliver(&req()).unwrap();
    assert!(s.contains(&format!("\nwant_content='{}'\n", "e".repeat(64))));
}

#[test]
fn every_placeholder_is_filled() {
    assert!(has_placeholder(DELIVER_TEMPLATE) && has_placeholder(RELEASE_TEMPLATE));
    assert!(!has_placeholder("\"$@\" a@b c@d"));
    let s = render_deliver(&req()).unwrap();
    assert!(!has_placeholder(&s));
    assert!(s.contains("\nroot='/workspace/.context'\n"));
    assert!(s.contains("\ninflated_cap='21'\n"));
    assert!(s.contains("\nverify='full'\n"));
    let r = render_release(&ReleaseRequest {
        root: "/r".into(),
        scope: req().scope,
        workload: "w".into(),
        run_id: "x".into(),
        retention: 4,
    })
    .unwrap();
    assert!(!has_placeholder(&r));
    assert!(r.contains("\nretention='4'\n"));
}

/// The agent's sources: its `Fail::new("code", …)` calls.
const AGENT_SOURCES: &[&str] = &[
    include_str!("../../../agent/src/args.rs"),
    include_str!("../../../agent/src/deliver.rs"),
    include_str!("../../../agent/src/fail.rs"),
    include_str!("../../../agent/src/receive.rs"),
];

#[test]
fn every_error_code_is_listed() {
    let mut printed: Vec<&str> = [DELIVER_TEMPLATE, RELEASE_TEMPLATE]
        .iter()
        .flat_map(|t| t.split("fail ").skip(1))
        .chain(
            AGENT_SOURCES
                .iter()
                .flat_map(|t| t.split("Fail::new(").skip(1)),
        )
        .map(|rest| rest.trim_start().trim_start_matches('"'))
        .filter_map(|rest| rest.split([' ', '"']).next())
        .filter(|code| {
            !code.is_empty() && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
        .collect();
    printed.sort_unstable();
    printed.dedup();
    assert!(printed.len() >= 12, "{printed:?}");
    for code in &printed {
        assert!(ERROR_CODES.contains(code), "{code} is not in ERROR_CODES");
    }
    for code in ERROR_CODES {
        assert!(printed.contains(code), "{code} is never printed");
    }
}

#[test]
fn the_agent_shares_the_workload_rule() {
    for name in [
        "a",
        "wl-1",
        "a-b-c",
        &"a".repeat(50),
        &"a".repeat(51),
        "-a",
        "a-",
        "A",
        "a_b",
        "",
    ] {
        assert_eq!(
            crate::delivery::rules::is_valid_workload(name),
            is_valid_name(name),
            "{name:?}"
        );
    }
}

#[test]
fn the_launcher_offers_only_checked_agents() {
    let offer = AgentOffer {
        x86_64: Some(("f".repeat(64), 1000)),
        aarch64: None,
    };
    let s = render_deliver_with_agent(&req(), &offer).unwrap();
    assert!(!has_placeholder(&s));
    assert!(s.contains(&format!("\nagent_x86_64='{}'\n", "f".repeat(64))));
    assert!(s.contains("\nagent_aarch64=''\n"));
    assert!(s.contains("scope='0123456789abcdef0123456789abcdef' workload='wl-1'"));
    // The script follows, whole.
    assert!(s.ends_with(&render_deliver(&req()).unwrap()));
    let bad = AgentOffer {
        x86_64: Some(("F".repeat(64), 1000)),
        aarch64: None,
    };
    assert_eq!(
        render_deliver_with_agent(&req(), &bad).unwrap_err().field(),
        "agent.x86_64"
    );
    assert_eq!(
        parse_line("AGENT x86_64"),
        Ok(ScriptLine::Agent("x86_64".into()))
    );
    assert!(parse_line("AGENT ../x").is_err());
    assert_eq!(
        parse_line("TRANSPORT agent\n"),
        Ok(ScriptLine::Transport(DeliveredBy::Agent))
    );
    assert!(parse_line("TRANSPORT pull").is_err());
}

#[test]
fn quoting_survives_a_quote() {
    assert_eq!(sh_quote("a'b"), r"'a'\''b'");
}

#[test]
fn root_rule() {
    for ok in [
        "/a",
        "/workspace/.context",
        "/a-b/c_d/E.9",
        "a",
        ".context",
        "w/.context",
    ] {
        assert!(is_valid_root(ok), "{ok}");
    }
    for bad in [
        "", "/", "//a", "/a/", "/a/../b", "/a/./b", "/..", "/a b", "/a'b", "/a$b", "..", "../a",
        "./a", "a/", "a//b", "a/../b", "a b", "a$(x)",
    ] {
        assert!(!is_valid_root(bad), "{bad}");
    }
    assert!(!is_valid_root(&format!("/{}", "a".repeat(1024))));
}

#[test]
fn run_id_rule() {
    assert!(is_valid_run_id("a"));
    assert!(is_valid_run_id(&format!("0{}", "._-".repeat(20) + "ab")));
    assert!(!is_valid_run_id(&"a".repeat(64)));
    for bad in ["", ".a", "-a", "_a", "A", "a b", "a/b"] {
        assert!(!is_valid_run_id(bad), "{bad}");
    }
}

#[test]
fn parses_every_line_kind() {
    assert_eq!(parse_line("NEED 42\n"), Ok(ScriptLine::Need(42)));
    assert!(parse_line("NEED +1").is_err());
    assert!(parse_line("NEED ").is_err());
    assert_eq!(
        parse_line("RESEND its file modes or sizes differ\n"),
        Ok(ScriptLine::Resend("its file modes or sizes differ".into()))
    );
    assert!(parse_line("RESEND").is_err());
    assert_eq!(
        parse_line("ERROR disk_full no space left on device while receiving"),
        Ok(ScriptLine::Error {
            code: "disk_full".into(),
            reason: "no space left on device while receiving".into()
        })
    );
    assert!(parse_line("ERROR Bad code").is_err());
    assert_eq!(
        parse_line(r#"{"path":"/r/runs/s/w/x","revision":"ab","cached":true}"#),
        Ok(ScriptLine::Done {
            path: "/r/runs/s/w/x".into(),
            revision: "ab".into(),
            cached: true
        })
    );
    assert_eq!(
        parse_line("{\"released\":false}\r\n"),
        Ok(ScriptLine::Released(false))
    );
    assert!(parse_line(r#"{"released":true,"x":1}"#).is_err());
    let long = "é".repeat(300);
    assert!(parse_line(&long).unwrap_err().line.len() <= 200);
}
