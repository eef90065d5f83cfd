//! The checks of the clients that generators make of the JSON API's
//! OpenAPI document (`tests/e2e/openapi.rs`): the operations of the
//! document, and which of its bodies the Python client of
//! openapi-python-client and the TypeScript types of openapi-typescript
//! leave without a type, or which operations they leave out. Include it with
//! `#[path = "common/generated.rs"] mod generated;` next to `mod common;`.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// One operation of the document.
pub struct Operation {
    pub method: String,
    pub path: String,
    pub id: Option<String>,
    /// The media types of its request body.
    pub request: Vec<String>,
    /// Each documented status with a body, and that body's media types.
    pub responses: Vec<(String, Vec<String>)>,
}

impl Operation {
    fn named(&self) -> String {
        format!(
            "{} {} ({})",
            self.method.to_uppercase(),
            self.path,
            self.id.as_deref().unwrap_or("no operationId")
        )
    }
}

const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options"];

/// The operations of `doc`, a `$ref` to a shared request body or response
/// followed.
pub fn operations(doc: &Value) -> Vec<Operation> {
    let follow = |v: &Value| -> Value {
        match v["$ref"].as_str() {
            Some(r) => doc
                .pointer(r.trim_start_matches('#'))
                .cloned()
                .unwrap_or_else(|| panic!("the document's {r} is not there")),
            None => v.clone(),
        }
    };
    let media = |v: &Value| -> Vec<String> {
        v["content"]
            .as_object()
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default()
    };
    let mut all = Vec::new();
    let paths = doc["paths"].as_object().expect("the document has paths");
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            if !METHODS.contains(&method.as_str()) {
                continue;
            }
            let responses = op["responses"]
                .as_object()
                .map(|r| {
                    r.iter()
                        .map(|(status, response)| (status.clone(), media(&follow(response))))
                        .filter(|(_, media)| !media.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            all.push(Operation {
                method: method.clone(),
                path: path.clone(),
                id: op["operationId"].as_str().map(str::to_owned),
                request: media(&follow(&op["requestBody"])),
                responses,
            });
        }
    }
    all
}

/// The module name openapi-python-client gives an operationId (its
/// `snake_case`: `listSlotRules` → `list_slot_rules`).
pub fn snake(id: &str) -> String {
    let mut out = String::new();
    let mut prev: Option<char> = None;
    for c in id.chars() {
        if c.is_ascii_uppercase()
            && prev.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit())
        {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
        prev = Some(c);
    }
    out
}

/// The generated client's modules of the operations (`api/<tag>/<op>.py`),
/// by file name.
fn python_modules(package: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for tag in std::fs::read_dir(package.join("api")).unwrap().flatten() {
        if tag.path().is_dir() {
            for module in std::fs::read_dir(tag.path()).unwrap().flatten() {
                found.push(module.path());
            }
        }
    }
    found
}

/// The generated models the names in `text` refer to (by the module's
/// `from ...models.FILE import NAME`) that are open objects: no property,
/// only `additional_properties: dict[str, Any]`, that is no type at all.
fn open_models(package: &Path, module: &str, text: &str) -> Vec<String> {
    let mut open = Vec::new();
    for line in module.lines() {
        let Some(rest) = line.strip_prefix("from ...models.") else {
            continue;
        };
        let Some((file, name)) = rest.split_once(" import ") else {
            continue;
        };
        let name = name.trim();
        let word = |c: char| c.is_alphanumeric() || c == '_';
        let used = text.match_indices(name).any(|(at, _)| {
            !text[..at].ends_with(word) && !text[at + name.len()..].starts_with(word)
        });
        if !used {
            continue;
        }
        let model = std::fs::read_to_string(package.join("models").join(format!("{file}.py")))
            .unwrap_or_default();
        let fields: Vec<&str> = model
            .lines()
            .take_while(|l| !l.starts_with("    def ") && !l.starts_with("    @"))
            .filter(|l| {
                l.starts_with("    ")
                    && !l.starts_with("     ")
                    && l.split_once(": ").is_some_and(|(f, _)| {
                        f.trim().chars().all(|c| c.is_alphanumeric() || c == '_')
                    })
            })
            .collect();
        let untyped = fields.iter().all(|f| {
            f.trim_start()
                .starts_with("additional_properties: dict[str, Any]")
        });
        if !model.contains("Enum)") && untyped {
            open.push(name.to_owned());
        }
    }
    open
}

/// The bodies the document describes that the Python client types as
/// `Any` (or as an object of no properties), and the operations it left
/// out: one line each.
pub fn python_untyped(package: &Path, ops: &[Operation]) -> Vec<String> {
    let modules = python_modules(package);
    let mut problems = Vec::new();
    for op in ops {
        let Some(id) = &op.id else {
            problems.push(format!("{}: no operationId", op.named()));
            continue;
        };
        let file = format!("{}.py", snake(id));
        let Some(module) = modules.iter().find(|m| m.ends_with(&file)) else {
            problems.push(format!("{}: not generated (no api/*/{file})", op.named()));
            continue;
        };
        let text = std::fs::read_to_string(module).unwrap();
        if !op.request.is_empty() {
            // `def _get_kwargs(..., body: TYPE, ...) -> dict[str, Any]:`
            let kwargs = text
                .split("def _get_kwargs(")
                .nth(1)
                .and_then(|rest| rest.split(") -> dict[str, Any]:").next())
                .unwrap_or("");
            let body = kwargs.lines().find_map(|l| {
                let ty = l.trim().strip_prefix("body: ")?.trim_end_matches(',');
                Some(ty.trim_end_matches(" = UNSET"))
            });
            match body {
                None => problems.push(format!("{}: the request body is not taken", op.named())),
                Some(ty) if ty.contains("Any") => {
                    problems.push(format!("{}: the request body is `{ty}`", op.named()))
                }
                Some(ty) => {
                    for model in open_models(package, &text, ty) {
                        problems.push(format!(
                            "{}: the request body is {model}, an object of no properties",
                            op.named()
                        ));
                    }
                }
            }
        }
        let parse = text
            .split("def _parse_response(")
            .nth(1)
            .and_then(|rest| rest.split("\ndef ").next())
            .unwrap_or("");
        for (status, _) in &op.responses {
            let head = format!("if response.status_code == {status}:");
            let Some(block) = parse.split(&head).nth(1) else {
                problems.push(format!("{}: its {status} answer is not parsed", op.named()));
                continue;
            };
            let block = block
                .split("if response.status_code ==")
                .next()
                .unwrap_or(block)
                .split("if client.raise_on_unexpected_status")
                .next()
                .unwrap_or(block);
            let untyped = block.contains("cast(Any")
                || block.contains("list[Any]")
                || block.contains("dict[str, Any]")
                || block
                    .lines()
                    .any(|l| l.trim() == format!("response_{status} = response.json()"));
            if untyped {
                problems.push(format!(
                    "{}: its {status} answer is parsed as Any:{}",
                    op.named(),
                    block.trim_end()
                ));
            }
            for model in open_models(package, &text, block) {
                problems.push(format!(
                    "{}: its {status} answer is {model}, an object of no properties",
                    op.named()
                ));
            }
        }
    }
    problems
}

/// `text` without its comments (`/** … */`, `// …`), whose words may hold
/// braces.
fn without_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("/*") {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once("*/").map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The members `key: TYPE;` of the object type that starts just after
/// `text[..]`'s opening brace, up to its closing one: `(key, TYPE)` with
/// the type's whitespace collapsed.
fn members(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ';' if depth == 0 => {
                let member = &text[start..i];
                if let Some((key, ty)) = member.split_once(':') {
                    let key = key.trim().trim_end_matches('?').trim_matches('"');
                    let ty = ty.split_whitespace().collect::<Vec<_>>().join(" ");
                    found.push((key.to_owned(), ty));
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    found
}

/// The members of the object type whose `head` (`schemas: {`) is the
/// first in `text`.
fn block(text: &str, head: &str) -> Vec<(String, String)> {
    text.find(head)
        .map(|at| members(&text[at + head.len()..]))
        .unwrap_or_default()
}

/// The types that say nothing of a body: anything, or an object of no
/// properties.
const NO_TYPE: &[&str] = &[
    "unknown",
    "never",
    "Record<string, never>",
    "Record<string, unknown>",
    "{ [key: string]: unknown; }",
    "{ [key: string]: never; }",
];

/// Whether the body type `ty` says nothing of the body as a whole: one of
/// [`NO_TYPE`], an array of one, a union with one, or a schema of
/// `components` that is one. (A property of no type inside a typed
/// object is the object's own business.)
fn untyped(ty: &str, schemas: &[(String, String)], depth: usize) -> bool {
    let ty = ty.trim();
    let ty = ty
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .filter(|inner| top_level(inner, " | ").len() > 1 || inner.ends_with("[]"))
        .unwrap_or(ty);
    let members = top_level(ty, " | ");
    if members.len() > 1 {
        return members
            .iter()
            .any(|m| *m != "null" && untyped(m, schemas, depth));
    }
    if let Some(item) = ty.strip_suffix("[]") {
        return untyped(item, schemas, depth);
    }
    if NO_TYPE.contains(&ty) {
        return true;
    }
    let schema = ty
        .strip_prefix("components[\"schemas\"][\"")
        .and_then(|rest| rest.strip_suffix("\"]"));
    match schema {
        Some(name) if depth < 8 => schemas
            .iter()
            .find(|(n, _)| n == name)
            .is_none_or(|(_, t)| untyped(t, schemas, depth + 1)),
        _ => false,
    }
}

/// `ty` split at each `sep` outside brackets of any kind.
fn top_level<'a>(ty: &'a str, sep: &str) -> Vec<&'a str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    let bytes = ty.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'(' | b'[' | b'<' => depth += 1,
            b'}' | b')' | b']' | b'>' => depth -= 1,
            _ if depth == 0 && ty[i..].starts_with(sep) => {
                parts.push(&ty[start..i]);
                i += sep.len();
                start = i;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&ty[start..]);
    parts
}

/// The bodies (`content` entries) the generated types leave without a type
/// ([`untyped`]), and the operations they leave out: one line each.
pub fn typescript_untyped(types: &str, ops: &[Operation]) -> Vec<String> {
    let text = without_comments(types);
    let schemas = block(&text, "schemas: {");
    let operations = block(&text, "export interface operations {");
    let mut problems = Vec::new();
    for op in ops {
        let Some(id) = &op.id else {
            problems.push(format!("{}: no operationId", op.named()));
            continue;
        };
        if !operations.iter().any(|(name, _)| name == id) {
            problems.push(format!("{}: not in `operations`", op.named()));
        }
    }
    // Every `content: {` block, with the operation (or shared component)
    // and the status it belongs to.
    let mut owner = String::new();
    let mut part = String::new();
    for (at, line) in text
        .match_indices('\n')
        .map(|(i, _)| (i + 1, &text[i + 1..]))
    {
        let line = line.lines().next().unwrap_or("");
        let indent = line.len() - line.trim_start().len();
        let key = line
            .trim()
            .strip_suffix(": {")
            .map(|k| k.trim_end_matches('?'))
            .filter(|k| !["content", "headers", "parameters"].contains(k));
        match (indent, key) {
            (4, Some(k)) => {
                owner = k.to_owned();
                part.clear();
            }
            (8 | 12, Some(k)) => part = k.to_owned(),
            _ => {}
        }
        if line.trim() != "content: {" {
            continue;
        }
        let body_at = at + line.len();
        for (media, ty) in members(&text[body_at..]) {
            if untyped(&ty, &schemas, 0) {
                problems.push(format!("{owner} {part}: its {media} body is `{ty}`"));
            }
        }
    }
    problems
}
