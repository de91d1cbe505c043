//! The Helm chart rendered the way `helm template` does (Debian ships no Helm): each template
//! through Go's template language (`gtmpl`) with `.Values`, `.Release` and `.Chart` and the few
//! Helm functions the chart uses, then parsed as YAML. Shared by the chart's tests and the
//! observability test (which checks the dashboard's and the rules' queries against a scrape).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gtmpl::{Context, FuncError, Template, Value as Gv};
use serde_json::{json, Value};

pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/tokenfactory")
}

pub fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("invalid YAML: {e}\n{text}"))
}

/// serde_json -> the template engine's values.
fn to_gtmpl(v: &Value) -> Gv {
    match v {
        Value::Null => Gv::Nil,
        Value::Bool(b) => Gv::from(*b),
        Value::Number(n) => n
            .as_i64()
            .map(Gv::from)
            .unwrap_or_else(|| Gv::from(n.as_f64().unwrap())),
        Value::String(s) => Gv::from(s.clone()),
        Value::Array(a) => Gv::Array(a.iter().map(to_gtmpl).collect()),
        Value::Object(m) => Gv::Map(
            m.iter()
                .map(|(k, v)| (k.clone(), to_gtmpl(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn empty(v: &Gv) -> bool {
    match v {
        Gv::NoValue | Gv::Nil => true,
        Gv::String(s) => s.is_empty(),
        _ => false,
    }
}

/// Helm's `quote`: the value as a double-quoted YAML string.
fn quote(args: &[Gv]) -> Result<Gv, FuncError> {
    let s = args
        .last()
        .map(|v| {
            if empty(v) {
                String::new()
            } else {
                v.to_string()
            }
        })
        .unwrap_or_default();
    Ok(Gv::from(serde_json::to_string(&s).unwrap()))
}

/// Helm's `default D V`: V unless it is empty.
fn default(args: &[Gv]) -> Result<Gv, FuncError> {
    match args {
        [d, v] if empty(v) => Ok(d.clone()),
        [_, v] => Ok(v.clone()),
        [d] => Ok(d.clone()),
        _ => Err(FuncError::ExactlyXArgs("default".into(), 2)),
    }
}

/// Helm's `add`: integer sum.
fn add(args: &[Gv]) -> Result<Gv, FuncError> {
    let mut sum = 0i64;
    for a in args {
        sum += a
            .to_string()
            .parse::<i64>()
            .map_err(|e| FuncError::Generic(e.to_string()))?;
    }
    Ok(Gv::from(sum))
}

/// The template engine's values -> serde_json.
fn from_gtmpl(v: &Gv) -> Value {
    match v {
        Gv::Bool(b) => Value::Bool(*b),
        Gv::Number(n) => n
            .as_i64()
            .map(Value::from)
            .or_else(|| n.as_f64().map(Value::from))
            .unwrap_or(Value::Null),
        Gv::String(s) => Value::String(s.clone()),
        Gv::Array(a) => Value::Array(a.iter().map(from_gtmpl).collect()),
        Gv::Map(m) | Gv::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), from_gtmpl(v))).collect())
        }
        _ => Value::Null,
    }
}

/// Helm's `toJson`.
fn to_json(args: &[Gv]) -> Result<Gv, FuncError> {
    match args {
        [v] => Ok(Gv::from(from_gtmpl(v).to_string())),
        _ => Err(FuncError::ExactlyXArgs("toJson".into(), 1)),
    }
}

/// `helm template RELEASE . --namespace NS`: every rendered document, parsed.
pub fn render(release: &str, namespace: &str) -> Vec<Value> {
    render_with(release, namespace, |_| {})
}

/// The chart's `values.yaml`.
pub fn default_values() -> Value {
    yaml(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
}

/// [`render`] with `edit` applied to `values.yaml` first (as `--set` does).
pub fn render_with(release: &str, namespace: &str, edit: impl FnOnce(&mut Value)) -> Vec<Value> {
    let mut values = default_values();
    edit(&mut values);
    render_values(release, namespace, values)
}

/// [`render`] with these values, checked against the schema first as Helm does.
pub fn render_values(release: &str, namespace: &str, values: Value) -> Vec<Value> {
    if let Err(errors) = check_values(&values) {
        panic!("values refused by values.schema.json: {errors:?}");
    }
    let dir = chart_dir();
    let chart = yaml(&std::fs::read_to_string(dir.join("Chart.yaml")).unwrap());
    let ctx = json!({
        "Values": values,
        "Release": {"Name": release, "Namespace": namespace},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
    });
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let mut t = Template::default();
        t.add_funcs(&[
            ("quote", quote as gtmpl::Func),
            ("default", default),
            ("add", add),
            ("toJson", to_json),
        ]);
        t.parse(std::fs::read_to_string(&file).unwrap()).unwrap();
        let out = t
            .render(&Context::from(to_gtmpl(&ctx)))
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            !out.contains("<no value>"),
            "{}: a value is missing:\n{out}",
            file.display()
        );
        for doc in out.split("\n---") {
            let v = yaml(doc);
            if !v.is_null() {
                docs.push(v);
            }
        }
    }
    docs
}

pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// Every PromQL expression of the chart's monitoring objects (rules and dashboard panels), as
/// rendered with them enabled: (where, expression).
pub fn monitoring_queries() -> Vec<(String, String)> {
    let docs = render_with("tf", "gateway", |values| {
        values["monitoring"]["prometheusRule"]["enabled"] = json!(true);
        values["monitoring"]["dashboard"]["enabled"] = json!(true);
    });
    let mut out = Vec::new();
    for group in find(&docs, "PrometheusRule", "tf")["spec"]["groups"]
        .as_array()
        .unwrap()
    {
        for rule in group["rules"].as_array().unwrap() {
            out.push((
                format!("rule {}", rule["alert"].as_str().unwrap()),
                rule["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    let dashboard: Value = serde_json::from_str(
        find(&docs, "ConfigMap", "tf-dashboard")["data"]["tokenfactory.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                format!("panel {}", panel["title"].as_str().unwrap()),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    let var = &dashboard["templating"]["list"][1]["definition"];
    out.push(("variable model".into(), var.as_str().unwrap().to_owned()));
    out
}

/// `values.schema.json`, as Helm applies it at install: the errors, one per bad value, each
/// `path: message`. Checked by the JSON Schema reference implementation (Python's `jsonschema`,
/// draft 7 like Helm's): a Rust validator crate's dev-only features rebuilt the whole dependency
/// tree of the test build.
pub fn check_values(values: &Value) -> Result<(), Vec<String>> {
    use std::io::Write;
    const CHECK: &str = "import json, sys, jsonschema\n\
        schema = json.load(open(sys.argv[1]))\n\
        jsonschema.Draft7Validator.check_schema(schema)\n\
        for e in jsonschema.Draft7Validator(schema).iter_errors(json.load(sys.stdin)):\n\
        \x20   print('/' + '/'.join(str(p) for p in e.absolute_path) + ': ' + e.message)\n";
    let mut child = std::process::Command::new("python3")
        .args(["-c", CHECK])
        .arg(chart_dir().join("values.schema.json"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (with the jsonschema package) checks the values");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(values.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the schema check failed to run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let errors: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}
