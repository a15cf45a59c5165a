//! `browser_snapshot`'s text: the page's accessibility tree, one node a line.
//!
//! The nodes come from CDP `Accessibility.getFullAXTree` as JSON. Each printed line is
//! `- role "name"` (indented two spaces a level), then `value="…"` and a few states
//! (`checked`, `disabled`, `expanded`, `selected`, `level`), then `[ref=N]` on the
//! elements a model can act on ([`INTERACTIVE_ROLES`]) that have a DOM node. To keep the
//! text short, ignored nodes and unnamed `generic`/`none` wrappers are not printed (their
//! children move up a level), inline text boxes are dropped, and a text node repeating
//! its parent's name or value is left out. Strings are cut at [`MAX_STRING`] characters and the
//! whole text at the cap given, with a marker saying how many nodes were left out.

use std::collections::HashMap;

use serde_json::Value;

/// Roles that get a `[ref=N]`: what `browser_click` and `browser_type` act on.
pub const INTERACTIVE_ROLES: [&str; 17] = [
    "link",
    "button",
    "textbox",
    "searchbox",
    "checkbox",
    "radio",
    "switch",
    "combobox",
    "listbox",
    "option",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "tab",
    "slider",
    "spinbutton",
    "treeitem",
];

/// Longest name or value printed, in characters.
pub const MAX_STRING: usize = 300;

/// States printed after the name, when the node has them.
const STATES: [&str; 6] = [
    "checked", "pressed", "disabled", "expanded", "selected", "level",
];

/// An element a ref points at.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub backend_node_id: i64,
    pub role: String,
    pub name: String,
}

/// The rendered tree and the refs it hands out.
#[derive(Debug)]
pub struct Snapshot {
    pub text: String,
    /// `(ref, element)`, in order of appearance.
    pub refs: Vec<(u64, Target)>,
    /// Nodes left out by the cap.
    pub truncated: usize,
}

struct Node<'a> {
    ignored: bool,
    role: &'a str,
    name: &'a str,
    value: String,
    children: Vec<&'a str>,
    backend: Option<i64>,
    states: Vec<String>,
}

/// A property value (`{"type": …, "value": …}`) as text.
fn ax_text(value: &Value) -> String {
    match &value["value"] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn parse(raw: &Value) -> Option<(&str, Node<'_>)> {
    let id = raw["nodeId"].as_str()?;
    let states = raw["properties"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|prop| {
            let name = prop["name"].as_str()?;
            if !STATES.contains(&name) {
                return None;
            }
            let value = ax_text(&prop["value"]);
            match (name, value.as_str()) {
                // Only the states that say something.
                (_, "false" | "") => None,
                ("disabled" | "selected", "true") => Some(name.to_owned()),
                _ => Some(format!("{name}={value}")),
            }
        })
        .collect();
    let node = Node {
        ignored: raw["ignored"].as_bool().unwrap_or(false),
        role: raw["role"]["value"].as_str().unwrap_or(""),
        name: raw["name"]["value"].as_str().unwrap_or(""),
        value: ax_text(&raw["value"]),
        children: raw["childIds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect(),
        backend: raw["backendDOMNodeId"].as_i64(),
        states,
    };
    Some((id, node))
}

/// Cuts `text` to [`MAX_STRING`] characters, on one line, with quotes escaped.
fn clean(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out: String = one_line
        .chars()
        .take(MAX_STRING)
        .collect::<String>()
        .replace('\\', "\\\\")
        .replace('"', "\\\"");
    if one_line.chars().count() > MAX_STRING {
        out.push('…');
    }
    out
}

/// The parsed nodes by id, and the root to walk from: the first node without a parent
/// (the document), or the first parsed node when every node names a parent.
fn index(nodes: &[Value]) -> (HashMap<&str, Node<'_>>, Option<&str>) {
    let mut by_id: HashMap<&str, Node<'_>> = HashMap::with_capacity(nodes.len());
    let mut order = Vec::with_capacity(nodes.len());
    for raw in nodes {
        if let Some((id, node)) = parse(raw) {
            order.push(id);
            by_id.insert(id, node);
        }
    }
    let root = nodes
        .iter()
        .find(|raw| raw.get("parentId").is_none_or(Value::is_null))
        .and_then(|raw| raw["nodeId"].as_str())
        .or_else(|| order.first().copied());
    (by_id, root)
}

/// A node that would only cost the model tokens: ignored, an empty wrapper, or text that
/// repeats the name or value of the nearest printed ancestor. Its children still print.
fn is_hidden(node: &Node<'_>, parent_text: (&str, &str)) -> bool {
    node.ignored
        || (matches!(node.role, "generic" | "none" | "presentation" | "")
            && node.name.is_empty()
            && node.value.is_empty())
        || (node.role == "StaticText"
            && (node.name.is_empty() || node.name == parent_text.0 || node.name == parent_text.1))
}

/// One printed line, and the target the model may act on when the node is interactive
/// (its `[ref=N]` is `next_ref`, taken only if the line fits).
fn line(node: &Node<'_>, depth: usize, next_ref: u64) -> (String, Option<Target>) {
    let mut line = format!("{}- ", "  ".repeat(depth));
    line.push_str(if node.role == "StaticText" {
        "text"
    } else {
        node.role
    });
    if !node.name.is_empty() {
        line.push_str(&format!(" \"{}\"", clean(node.name)));
    }
    if !node.value.is_empty() && node.value != node.name {
        line.push_str(&format!(" value=\"{}\"", clean(&node.value)));
    }
    for state in &node.states {
        line.push_str(&format!(" [{state}]"));
    }
    let target = node
        .backend
        .filter(|_| INTERACTIVE_ROLES.contains(&node.role))
        .map(|backend_node_id| Target {
            backend_node_id,
            role: node.role.to_owned(),
            name: node.name.to_owned(),
        });
    if target.is_some() {
        line.push_str(&format!(" [ref={next_ref}]"));
    }
    line.push('\n');
    (line, target)
}

/// Renders `nodes` (the `nodes` of `Accessibility.getFullAXTree`) within `cap` bytes,
/// numbering refs from `first_ref`.
pub fn render(nodes: &[Value], first_ref: u64, cap: usize) -> Snapshot {
    let (by_id, root) = index(nodes);

    let mut text = String::new();
    let mut refs = Vec::new();
    let mut next_ref = first_ref;
    let mut truncated = 0usize;
    // (node, depth, the name and value of the nearest printed ancestor)
    let mut stack: Vec<(&str, usize, (&str, &str))> =
        root.map(|r| (r, 0, ("", ""))).into_iter().collect();
    let mut seen = std::collections::HashSet::new();
    while let Some((id, depth, parent_text)) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = by_id.get(id) else {
            continue;
        };
        if node.role == "InlineTextBox" {
            continue;
        }
        let (child_depth, child_parent_text) = if is_hidden(node, parent_text) {
            (depth, parent_text)
        } else if truncated > 0 {
            truncated += 1;
            (depth + 1, (node.name, node.value.as_str()))
        } else {
            let (line, target) = line(node, depth, next_ref);
            if text.len() + line.len() > cap {
                truncated += 1;
            } else {
                text.push_str(&line);
                if let Some(target) = target {
                    refs.push((next_ref, target));
                    next_ref += 1;
                }
            }
            (depth + 1, (node.name, node.value.as_str()))
        };
        for child in node.children.iter().rev() {
            stack.push((child, child_depth, child_parent_text));
        }
    }
    if truncated > 0 {
        text.push_str(&format!(
            "[... snapshot truncated: {truncated} more nodes not shown ...]\n"
        ));
    }
    Snapshot {
        text,
        refs,
        truncated,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn node(id: &str, role: &str, name: &str, children: &[&str], backend: i64) -> Value {
        json!({
            "nodeId": id,
            "ignored": false,
            "role": {"type": "role", "value": role},
            "name": {"type": "computedString", "value": name},
            "childIds": children,
            "backendDOMNodeId": backend,
        })
    }

    fn page() -> Vec<Value> {
        let mut root = node("1", "RootWebArea", "Test page", &["2"], 1);
        root.as_object_mut().unwrap().remove("parentId");
        let mut ignored = node("2", "generic", "", &["3", "5", "7", "9"], 2);
        ignored["ignored"] = json!(true);
        let mut textbox = node("7", "textbox", "Your name", &["8"], 7);
        textbox["value"] = json!({"type": "string", "value": "Ada"});
        textbox["properties"] = json!([
            {"name": "focusable", "value": {"type": "booleanOrUndefined", "value": true}},
            {"name": "disabled", "value": {"type": "boolean", "value": false}},
        ]);
        let mut heading = node("3", "heading", "Hello \"world\"", &["4"], 3);
        heading["properties"] =
            json!([{"name": "level", "value": {"type": "integer", "value": 1}}]);
        vec![
            root,
            ignored,
            heading,
            node("4", "StaticText", "Hello \"world\"", &["41"], 4),
            node("41", "InlineTextBox", "Hello", &[], 41),
            node("5", "link", "Docs", &["6"], 5),
            node("6", "StaticText", "Docs", &[], 6),
            textbox,
            node("8", "StaticText", "Ada", &[], 8),
            node("9", "generic", "", &["10", "11"], 9),
            node("10", "StaticText", "Some text", &[], 10),
            node("11", "button", "Go", &[], 11),
        ]
    }

    #[test]
    fn the_tree_is_indented_with_refs_on_interactive_nodes() {
        let snap = render(&page(), 5, 64 * 1024);
        assert_eq!(
            snap.text,
            "- RootWebArea \"Test page\"\n\
             \x20 - heading \"Hello \\\"world\\\"\" [level=1]\n\
             \x20 - link \"Docs\" [ref=5]\n\
             \x20 - textbox \"Your name\" value=\"Ada\" [ref=6]\n\
             \x20 - text \"Some text\"\n\
             \x20 - button \"Go\" [ref=7]\n"
        );
        let refs: Vec<_> = snap
            .refs
            .iter()
            .map(|(r, t)| (*r, t.backend_node_id, t.role.as_str()))
            .collect();
        assert_eq!(refs, [(5, 5, "link"), (6, 7, "textbox"), (7, 11, "button")]);
        assert_eq!(snap.truncated, 0);
    }

    #[test]
    fn the_cap_cuts_with_a_marker_and_hands_out_no_refs_past_it() {
        let snap = render(&page(), 1, 60);
        assert!(snap.text.len() < 60 + 80, "{}", snap.text);
        assert!(
            snap.text
                .ends_with("[... snapshot truncated: 5 more nodes not shown ...]\n"),
            "{}",
            snap.text
        );
        assert!(snap.refs.iter().all(|(r, _)| *r == 1), "{:?}", snap.refs);
    }

    #[test]
    fn long_strings_are_cut_and_kept_on_one_line() {
        let long = "a\nb ".repeat(400);
        let cleaned = clean(&long);
        assert!(!cleaned.contains('\n'));
        assert_eq!(cleaned.chars().count(), MAX_STRING + 1);
        assert!(cleaned.ends_with('…'));
    }

    #[test]
    fn an_empty_or_odd_tree_renders_without_panicking() {
        assert_eq!(render(&[], 1, 100).text, "");
        let odd = vec![
            json!({"nodeId": "1", "childIds": ["1", "2"]}),
            json!({"x": 1}),
        ];
        let snap = render(&odd, 1, 100);
        assert!(snap.refs.is_empty());
    }
}
