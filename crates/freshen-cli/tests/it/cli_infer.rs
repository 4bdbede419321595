//! Views that are only a query: `freshen check` and `freshen run` infer what they watch
//! from PostgreSQL (the query's plan and the catalog), against a real server. The SaaS
//! read models of `support::saas`, declared without a single `watch` entry, plus a
//! referral view that reads `accounts` twice through a nullable self-reference, run
//! through the randomized workload across a SIGKILL with no reconcile sweep, and must
//! equal a fresh computation and the hand-written view; the refusals say what to write.

use crate::support;

use std::time::Duration;

use freshen_testenv::refresher::eventually;
use serde_json::Value;
use support::saas;
use support::*;

/// Referrals: `accounts.referred_by` (nullable, SET NULL when the referrer goes), set by
/// a trigger so that the saas workload's inserts and renames also set, move and clear
/// it (witness rows, negative ids, are left alone); the referral view reads accounts
/// twice and subscriptions through the referrer. Plus a hand-written copy of
/// `account_mrr` to compare with.
const REFERRALS: &str = "
ALTER TABLE accounts ADD referred_by bigint REFERENCES accounts ON DELETE SET NULL;
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE INDEX ON accounts (referred_by);
CREATE FUNCTION refer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id > 0 AND (TG_OP = 'INSERT' OR NEW.name IS DISTINCT FROM OLD.name) THEN
    NEW.referred_by := CASE WHEN NEW.id % 4 = 0 THEN NULL ELSE
      (SELECT id FROM accounts WHERE id > 0 AND id <> NEW.id
        ORDER BY (id * 31 + length(NEW.name) + NEW.id) % 17, id LIMIT 1) END;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refer BEFORE INSERT OR UPDATE ON accounts FOR EACH ROW EXECUTE FUNCTION refer();
CREATE TABLE account_referrer (account_id bigint PRIMARY KEY, referrer text, referrer_seats bigint NOT NULL);
CREATE TABLE account_mrr_hand (account_id bigint PRIMARY KEY, mrr bigint NOT NULL);
";

const MRR_QUERY: &str = "SELECT a.id AS account_id, coalesce(sum(s.seats * p.price), 0)::bigint AS mrr FROM accounts a LEFT JOIN subscriptions s ON s.account_id = a.id LEFT JOIN plans p ON p.id = s.plan_id WHERE a.id = ANY($1) GROUP BY a.id";

const REFERRER: &str = "SELECT a.id AS account_id, r.name AS referrer, coalesce((SELECT sum(s.seats) FROM subscriptions s WHERE s.account_id = r.id), 0)::bigint AS referrer_seats FROM accounts a LEFT JOIN accounts r ON r.id = a.referred_by";

/// The saas query views with their `watch` lists cut out, the referral view, and the
/// hand-written `account_mrr_hand`.
fn inferred_config(url: &str, http: &str, timing: &str) -> String {
    let text = saas::query_config(url, http, timing);
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with("watch = [") {
            skipping = true;
            continue;
        }
        if skipping {
            skipping = line != "]";
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&format!(
        r#"
[[views]]
name = "account_referrer"
into = "account_referrer"
query = "{REFERRER} WHERE a.id = ANY($1)"

[[views]]
name = "account_mrr_hand"
watch = [
  {{ table = "public.subscriptions", key = ["account_id"] }},
  {{ table = "public.accounts", key = ["id"] }},
  {{ table = "public.plans", key = ["id"], keys = "SELECT account_id FROM subscriptions WHERE plan_id = $1" }},
]
into = "account_mrr_hand"
query = "{MRR_QUERY}"
"#
    ));
    out
}

/// The `{ table, key, keys }` entries of a `watch = [...]` list in TOML, each as
/// (table, key, keys without a `public.` qualifier): the spelling of a hand-written
/// entry and an inferred one may differ only there.
fn entries(toml_text: &str) -> Vec<(String, String, String)> {
    let doc: toml_edit::DocumentMut = toml_text.parse().expect("the printed entries are TOML");
    let mut out: Vec<(String, String, String)> = doc["watch"]
        .as_array()
        .expect("a watch list")
        .iter()
        .map(|e| {
            let t = e.as_inline_table().expect("an inline table");
            let s = |k: &str| {
                t.get(k)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            let key: Vec<&str> = t
                .get("key")
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|k| k.as_str()).collect())
                .unwrap_or_default();
            (s("table"), key.join(","), s("keys").replace("public.", ""))
        })
        .collect();
    out.sort();
    out
}

/// The `watch = [...]` block a view's section of `text` holds.
fn watch_block(text: &str, view: &str) -> String {
    let at = text
        .find(&format!("name = \"{view}\""))
        .expect("the view is in the file");
    let start = at + text[at..].find("watch = [").expect("a watch list");
    let end = start + text[start..].find("\n]").expect("its end") + 2;
    text[start..end].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_infers_the_entries_a_careful_person_writes() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    c.batch_execute(REFERRALS).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (code, f) = check_json(
        dir.path(),
        &inferred_config(&pg.url(), "off", "coalesce = \"20ms\""),
    );
    let errors: Vec<&Value> = f.iter().filter(|x| x["level"] == "error").collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(code, Some(0), "{f:#?}");
    let hand = saas::query_config("u", "off", "");
    for view in ["account_mrr", "product_sales", "account_search"] {
        let inferred = f
            .iter()
            .find(|x| x["check"] == "infer" && x["subject"] == format!("view {view}"))
            .unwrap_or_else(|| panic!("no inferred entries for {view}: {f:#?}"));
        let text = inferred["message"].as_str().unwrap();
        let toml_text = &text[text.find("watch = [").expect("TOML to paste")..];
        assert_eq!(
            entries(toml_text),
            entries(&watch_block(&hand, view)),
            "{view}: inferred entries differ from the hand-written ones"
        );
    }
    // The self-join: accounts watched by its key and through the referrer.
    let referrer = f
        .iter()
        .find(|x| x["check"] == "infer" && x["subject"] == "view account_referrer")
        .expect("the referral view's entries");
    let text = referrer["message"].as_str().unwrap();
    assert!(
        text.contains("{ table = \"public.accounts\", key = [\"id\"] }"),
        "{text}"
    );
    assert!(
        text.contains("{ table = \"public.accounts\", key = [\"id\"], keys = \"SELECT id FROM public.accounts WHERE referred_by = $1\" }"),
        "{text}"
    );
    assert!(
        text.contains("{ table = \"public.subscriptions\", key = [\"account_id\"], keys = \"SELECT id FROM public.accounts WHERE referred_by = $1\" }"),
        "{text}"
    );
    // A view may mix: the file's entry stays, the rest is inferred around it.
    let mixed = format!(
        r#"
[source]
kind = "postgres"
url = "{}"
slot = "freshen_mixed"
publication = "freshen_mixed"

[[views]]
name = "account_mrr"
into = "account_mrr"
watch = [ {{ table = "public.subscriptions", key = ["account_id"] }} ]
query = "{MRR_QUERY}"
"#,
        pg.url()
    );
    let (code, m) = check_json(dir.path(), &mixed);
    assert_eq!(code, Some(0), "{m:#?}");
    let inferred = messages(&m, "ok", "infer");
    assert_eq!(inferred.len(), 1, "{m:#?}");
    let toml_text = &inferred[0][inferred[0].find("watch = [").unwrap()..];
    let got: Vec<String> = entries(toml_text).into_iter().map(|e| e.0).collect();
    assert_eq!(got, ["public.accounts", "public.plans"], "{toml_text}");
    // The advice check gives for entries covers inferred ones: the fan-out's index.
    assert!(
        messages(&f, "ok", "index")
            .iter()
            .any(|m| m.contains("inferred `keys` statement finds public.accounts's rows")),
        "{f:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inferred_views_equal_hand_written_ones_and_a_fresh_computation_across_a_sigkill() {
    let pg = start_pg();
    let mut c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    c.batch_execute(REFERRALS).await.unwrap();
    // A debounce long enough that changes are pending when the process dies.
    let timing = "coalesce = \"200ms\"\nmax_wait = \"1s\"";
    let (dir, base, mut second) = saas::across_a_sigkill(
        &mut c,
        |http| inferred_config(&pg.url(), http, timing),
        0x1f3,
        [150, 150, 100, 100],
    )
    .await;
    // The saas views matched a fresh computation (and kept their witnesses). Then
    // changes that reach the views only through inferred fan-outs: every plan's price
    // and name, every other invoice voided, referrers' seats and names.
    c.batch_execute(
        "UPDATE plans SET price = price + 1000 WHERE id > 0;
         UPDATE plans SET name = name || '!' WHERE id > 0;
         UPDATE invoices SET voided = NOT voided WHERE id > 0 AND id % 2 = 0;
         UPDATE subscriptions SET seats = seats + 7 WHERE account_id IN (SELECT referred_by FROM accounts);
         UPDATE accounts SET name = name || '*' WHERE id IN (SELECT referred_by FROM accounts);",
    )
    .await
    .unwrap();
    saas::wait_equal(&c, Duration::from_secs(60)).await;
    let log = log_of(dir.path(), 2);
    assert!(
        log.contains("account_referrer")
            && log.contains("watching what its query reads (inferred)"),
        "the restarted run inferred its entries:\n{log}"
    );
    // The referral view and the hand-written copy match too.
    let referral = format!(
        "SELECT count(*) FROM ((SELECT * FROM account_referrer EXCEPT {REFERRER}) UNION ALL ({REFERRER} EXCEPT SELECT * FROM account_referrer)) d"
    );
    let hand = "SELECT count(*) FROM ((SELECT * FROM account_mrr EXCEPT SELECT * FROM account_mrr_hand) UNION ALL (SELECT * FROM account_mrr_hand EXCEPT SELECT * FROM account_mrr)) d";
    eventually(
        60,
        "the referral view and the hand-written copy to match",
        || {
            let (c, referral) = (&c, &referral);
            async move {
                let a: i64 = c.query_one(referral, &[]).await.unwrap().get(0);
                let b: i64 = c.query_one(hand, &[]).await.unwrap().get(0);
                (a == 0 && b == 0).then_some(())
            }
        },
    )
    .await;
    // The workload exercised what the entries are for.
    let moved: i64 = c
        .query_one(
            "SELECT count(*) FILTER (WHERE referred_by IS NOT NULL) * count(*) FILTER (WHERE referred_by IS NULL AND id > 0) FROM accounts",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(moved > 0, "referrals both set and NULL");
    let referred: i64 = c
        .query_one(
            "SELECT count(*) FROM account_referrer WHERE referrer IS NOT NULL AND referrer_seats > 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(referred > 0, "referrers with subscriptions to fan out from");
    // Witnesses (changed just before the kill, never again) in the referral view too.
    let witnesses: i64 = c
        .query_one(
            &format!(
                "SELECT count(*) FROM (SELECT * FROM account_referrer INTERSECT {REFERRER}) x WHERE x.account_id BETWEEN -6 AND -1"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(witnesses, 6, "witness accounts lost from the referral view");
    assert!(
        saas::fanned_keys(&base).await > 0,
        "plan changes fanned out"
    );
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_inferred_is_refused_with_what_to_write() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    c.batch_execute(
        "CREATE TABLE plan_count (account_id bigint PRIMARY KEY, n bigint NOT NULL);
         CREATE FUNCTION open_invoices(bigint) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
           BEGIN RETURN (SELECT count(*) FROM invoices WHERE account_id = $1 AND NOT voided); END $$;
         CREATE TABLE account_open (account_id bigint PRIMARY KEY, n bigint NOT NULL);",
    )
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = |views: &str| {
        format!(
            r#"
[source]
kind = "postgres"
url = "{}"
slot = "freshen_refuse"
publication = "freshen_refuse"

# `run` is refused before it serves; off, it binds no port another freshen may hold.
[http]
listen = "off"

{views}
"#,
            pg.url()
        )
    };
    let cross = r#"
[[views]]
name = "plan_count"
into = "plan_count"
query = "SELECT a.id AS account_id, count(p.id) AS n FROM accounts a CROSS JOIN plans p WHERE a.id = ANY($1) GROUP BY a.id"
"#;
    let (code, f) = check_json(dir.path(), &file(cross));
    assert_eq!(code, Some(1), "{f:#?}");
    let refused = messages(&f, "error", "infer");
    assert_eq!(refused.len(), 1, "{f:#?}");
    assert!(
        refused[0].contains("reads public.plans (as `p`)")
            && refused[0].contains("a cross join")
            && refused[0].contains("$1 = a.id")
            && refused[0].contains("keys = \"SELECT")
            && refused[0].contains("static = [\"public.plans\"]"),
        "{refused:?}"
    );
    // `run` refuses alike, before it creates anything.
    let cfg = write_config(dir.path(), &file(cross));
    let out = freshen().args(["run", "-c"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("reads public.plans (as `p`)"), "{stderr}");
    let slots: i64 = c
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "a refused configuration creates no slot");
    // Declared static (its changes ignored on purpose), the rest is inferred.
    let declared = cross.replace(
        "into = \"plan_count\"",
        "into = \"plan_count\"\nstatic = [\"public.plans\"]",
    );
    let (code, f) = check_json(dir.path(), &file(&declared));
    assert_eq!(code, Some(0), "{f:#?}");
    assert!(
        messages(&f, "ok", "infer")
            .iter()
            .any(|m| m.contains("{ table = \"public.accounts\", key = [\"id\"] }")),
        "{f:#?}"
    );

    let hidden = r#"
[[views]]
name = "account_open"
into = "account_open"
query = "SELECT a.id AS account_id, open_invoices(a.id) AS n FROM accounts a WHERE a.id = ANY($1)"
"#;
    let (code, f) = check_json(dir.path(), &file(hidden));
    assert_eq!(code, Some(1), "{f:#?}");
    let refused = messages(&f, "error", "infer");
    assert_eq!(refused.len(), 1, "{f:#?}");
    assert!(
        refused[0].contains("calls public.open_invoices")
            && refused[0].contains("Write the view's `watch` entries by hand")
            && refused[0].contains("BEGIN ATOMIC"),
        "{refused:?}"
    );
    // Written by hand, the view passes (the file's entries win).
    let by_hand = hidden.replace(
        "into = \"account_open\"",
        "into = \"account_open\"\nwatch = [\n  { table = \"public.accounts\", key = [\"id\"] },\n  { table = \"public.invoices\", key = [\"account_id\"] },\n]",
    );
    let (code, f) = check_json(dir.path(), &file(&by_hand));
    assert!(messages(&f, "error", "infer").is_empty(), "{f:#?}");
    assert!(
        f.iter()
            .all(|x| x["level"] != "error" || x["check"] != "depends"),
        "{f:#?}"
    );
    let _ = code;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_writes_a_starting_file_that_check_accepts() {
    let pg = start_pg();
    let c = connect(&pg.url()).await;
    c.batch_execute(saas::SCHEMA).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("freshen.toml");
    let init = || {
        freshen()
            .args(["init", "--name", "mrr", "--into", "mrr_started", "--query"])
            .arg(MRR_QUERY)
            .arg("-o")
            .arg(&file)
            .env("APP_DB", pg.url())
            .args(["--url-env", "APP_DB"])
            .output()
            .unwrap()
    };
    let out = init();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("url = \"${APP_DB}\""), "{text}");
    assert!(
        !text.contains(&pg.url()),
        "the URL is never written: {text}"
    );
    assert!(
        text.contains("{ table = \"public.plans\", key = [\"id\"], keys = \"SELECT account_id FROM public.subscriptions WHERE plan_id = $1\" }"),
        "{text}"
    );
    // The target table it says to create, created, makes a file check accepts.
    let create = text
        .lines()
        .map(|l| l.trim_start_matches('#').trim())
        .find(|l| l.starts_with("CREATE TABLE"))
        .expect("the target's CREATE TABLE");
    c.batch_execute(create).await.unwrap();
    let out = freshen()
        .args(["check", "--json", "-c"])
        .arg(&file)
        .env("APP_DB", pg.url())
        .output()
        .unwrap();
    let f = findings(&out);
    let errors: Vec<&Value> = f.iter().filter(|x| x["level"] == "error").collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(out.status.code(), Some(0));
    // An existing file is never overwritten.
    let again = init();
    assert!(!again.status.success());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // Without the variable set it says which to set.
    let out = freshen()
        .args(["init", "--name", "v", "--into", "t", "--query", "SELECT 1"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("set DATABASE_URL to the database URL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
