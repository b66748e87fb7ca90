//! Tools whose parameters carry their own definitions (pydantic's `$defs`, older
//! `definitions`, nested definitions, self-reference): the call's grammar, compiled as the
//! Llama 3 format compiles it (`start: %json{…}`), accepts a valid call and refuses an invalid
//! one.

use super::*;
use crate::decode::constraint::{ConstraintVocab, Grammar};

/// One token per printable ASCII byte, then a special end token.
fn vocab() -> (ConstraintVocab, u32) {
    crate::decode::constraint::tests::byte_vocab()
}

/// Whether `text` is a whole sentence of `tools`' call grammar (key `arguments`).
fn accepts(tools: &[ToolSchema], text: &str) -> bool {
    let (cv, end) = vocab();
    let grammar = Grammar::Lark(format!(
        "start: {}",
        embedded(&call_schema(tools, "arguments"))
    ));
    let mut c = cv.compile(&grammar).unwrap_or_else(|e| panic!("{e}"));
    let mut logits = vec![0.0f32; end as usize + 1];
    for b in text.bytes() {
        logits.fill(0.0);
        let Ok(allowed) = c.allowed() else {
            return false;
        };
        allowed.mask(&mut logits);
        let id = (b - 0x20) as u32;
        if !logits[id as usize].is_finite() || c.advance(id).is_err() {
            return false;
        }
    }
    logits.fill(0.0);
    match c.allowed() {
        Ok(allowed) => {
            allowed.mask(&mut logits);
            logits[end as usize].is_finite()
        }
        Err(_) => false,
    }
}

fn tool(name: &str, parameters: Value) -> ToolSchema {
    ToolSchema {
        name: name.into(),
        parameters,
    }
}

/// As pydantic writes `class Address: street: str; city: str` inside `class Person`.
fn person() -> Value {
    json!({
        "$defs": {"Address": {"type": "object", "title": "Address",
                              "properties": {"street": {"type": "string", "maxLength": 20},
                                             "city": {"type": "string", "maxLength": 20}},
                              "required": ["street", "city"], "additionalProperties": false}},
        "type": "object", "title": "Person",
        "properties": {"name": {"type": "string", "maxLength": 20},
                       "addr": {"$ref": "#/$defs/Address"}},
        "required": ["name", "addr"], "additionalProperties": false
    })
}

#[test]
fn references_are_relocated_under_the_base() {
    let params = json!({"$ref": "#", "items": {"$ref": "#/$defs/A~1b"}, "x": {"$ref": "#anchor"},
                        "const": {"$ref": "#/data"}});
    let moved = relocate(&params, "/properties/arguments");
    assert_eq!(moved["$ref"], "#/properties/arguments");
    assert_eq!(moved["items"]["$ref"], "#/properties/arguments/$defs/A~1b");
    assert_eq!(moved["x"]["$ref"], "#anchor", "an anchor is not a pointer");
    assert_eq!(moved["const"]["$ref"], "#/data", "data is not a schema");
}

#[test]
fn a_pydantic_nested_model_is_a_forced_tool() {
    let tools = [tool("save_person", person())];
    let good = r#"{"name":"save_person","arguments":{"name":"Ann","addr":{"street":"Main","city":"Oslo"}}}"#;
    assert!(accepts(&tools, good));
    let missing_city =
        r#"{"name":"save_person","arguments":{"name":"Ann","addr":{"street":"Main"}}}"#;
    assert!(!accepts(&tools, missing_city));
    let addr_a_string = r#"{"name":"save_person","arguments":{"name":"Ann","addr":"Main"}}"#;
    assert!(!accepts(&tools, addr_a_string));
}

#[test]
fn definitions_and_refs_into_nested_definitions() {
    let params = json!({
        "definitions": {"Geo": {"type": "object",
                                "$defs": {"Deg": {"type": "integer", "minimum": 0, "maximum": 90}},
                                "properties": {"lat": {"$ref": "#/definitions/Geo/$defs/Deg"}},
                                "required": ["lat"], "additionalProperties": false}},
        "type": "object", "properties": {"at": {"$ref": "#/definitions/Geo"}},
        "required": ["at"], "additionalProperties": false
    });
    let tools = [tool("locate", params)];
    assert!(accepts(
        &tools,
        r#"{"name":"locate","arguments":{"at":{"lat":45}}}"#
    ));
    assert!(!accepts(
        &tools,
        r#"{"name":"locate","arguments":{"at":{"lat":"45"}}}"#
    ));
}

#[test]
fn two_tools_each_with_their_own_address() {
    let number_address = json!({
        "$defs": {"Address": {"type": "object", "properties": {"number": {"type": "integer", "minimum": 0, "maximum": 999}},
                              "required": ["number"], "additionalProperties": false}},
        "type": "object", "properties": {"to": {"$ref": "#/$defs/Address"}},
        "required": ["to"], "additionalProperties": false
    });
    let tools = [tool("save_person", person()), tool("deliver", number_address)];
    assert!(accepts(
        &tools,
        r#"{"name":"save_person","arguments":{"name":"A","addr":{"street":"S","city":"C"}}}"#
    ));
    assert!(accepts(
        &tools,
        r#"{"name":"deliver","arguments":{"to":{"number":12}}}"#
    ));
    // Each tool's Address is its own: the other's shape is refused.
    assert!(!accepts(
        &tools,
        r#"{"name":"deliver","arguments":{"to":{"street":"S","city":"C"}}}"#
    ));
    assert!(!accepts(
        &tools,
        r#"{"name":"save_person","arguments":{"name":"A","addr":{"number":12}}}"#
    ));
}

#[test]
fn a_self_referencing_tree() {
    let tree = json!({
        "type": "object",
        "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                       "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["v"], "additionalProperties": false
    });
    let tools = [tool("other", json!({"type": "object"})), tool("tree", tree)];
    assert!(accepts(
        &tools,
        r#"{"name":"tree","arguments":{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}}"#
    ));
    // `#` is the tree, not the call: a call object inside is refused.
    assert!(!accepts(
        &tools,
        r#"{"name":"tree","arguments":{"v":1,"kids":[{"name":"tree"}]}}"#
    ));
}
