//! llama.cpp's GBNF grammars (`root ::= "a" rule*`, its `grammars/README.md`) rewritten in the
//! Lark syntax llguidance reads: a port of llguidance's own `gbnf_to_lark.py`.
//!
//! GBNF: rules `name ::= alternatives` (a rule ends at a newline outside parentheses), `root` the
//! start; literals `"..."`, character classes `[a-z]` / `[^"\\]`, `.` any character, groups
//! `( ... )`, `|`, repetitions `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments; escapes `\n \r
//! \t \" \\ \[ \] \xHH \uHHHH \UHHHHHHHH`. Lark: `start` for `root`; a character class or `.`
//! becomes a `/regex/`; a rule made only of literals, classes and such rules becomes a terminal
//! (an upper-case name: one lexeme), every other rule a lower-case one (`-` → `_`).

use super::grammar_limits::{check_rule_depth, check_size, chain_depths};
use super::grammar_limits::{MAX_GBNF_NESTING, MAX_GRAMMAR_BYTES};
use crate::error::{Error, Result};
use std::collections::HashMap;


/// One GBNF expression.
#[derive(Clone, Debug)]
enum Node {
    /// A literal's characters, escapes kept as written (Lark reads the same ones).
    Literal(String),
    /// A character class or `.`, as a regular expression.
    Regex(String),
    /// A rule's name.
    Ref(String),
    Repeat(Box<Node>, usize, Option<usize>),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
}

impl Node {
    fn simplify(self) -> Node {
        match self {
            Node::Seq(nodes) => {
                let mut nodes: Vec<Node> = nodes.into_iter().map(Node::simplify).collect();
                if nodes.len() == 1 {
                    nodes.remove(0)
                } else {
                    Node::Seq(nodes)
                }
            }
            Node::Alt(nodes) => {
                let mut nodes: Vec<Node> = nodes.into_iter().map(Node::simplify).collect();
                if nodes.len() == 1 {
                    nodes.remove(0)
                } else {
                    Node::Alt(nodes)
                }
            }
            Node::Repeat(inner, lo, hi) => Node::Repeat(Box::new(inner.simplify()), lo, hi),
            other => other,
        }
    }

    fn atomic(&self) -> bool {
        !matches!(self, Node::Seq(_) | Node::Alt(_))
    }

    /// Whether only literals, regexes and terminal rules make it.
    fn terminal(&self, terminals: &HashMap<String, bool>) -> bool {
        match self {
            Node::Literal(_) | Node::Regex(_) => true,
            Node::Ref(name) => terminals.get(name).copied().unwrap_or(false),
            Node::Repeat(inner, ..) => inner.terminal(terminals),
            Node::Seq(nodes) | Node::Alt(nodes) => nodes.iter().all(|n| n.terminal(terminals)),
        }
    }

    fn refs<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Node::Ref(name) => out.push(name),
            Node::Repeat(inner, ..) => inner.refs(out),
            Node::Seq(nodes) | Node::Alt(nodes) => nodes.iter().for_each(|n| n.refs(out)),
            _ => {}
        }
    }

    fn write(&self, names: &HashMap<String, String>, top: bool) -> String {
        match self {
            Node::Literal(s) => format!("\"{s}\""),
            Node::Regex(rx) => format!("/{rx}/"),
            Node::Ref(name) => names.get(name).cloned().unwrap_or_else(|| name.clone()),
            Node::Repeat(inner, lo, hi) => {
                let mut s = inner.write(names, false);
                if !inner.atomic() {
                    s = format!("({s})");
                }
                match (lo, hi) {
                    (0, None) => format!("{s}*"),
                    (1, None) => format!("{s}+"),
                    (0, Some(1)) => format!("{s}?"),
                    (lo, None) => format!("{s}{{{lo},}}"),
                    (lo, Some(hi)) => format!("{s}{{{lo},{hi}}}"),
                }
            }
            Node::Seq(nodes) if nodes.is_empty() => "\"\"".to_string(),
            Node::Seq(nodes) => nodes
                .iter()
                .map(|n| n.write(names, false))
                .collect::<Vec<_>>()
                .join(" "),
            Node::Alt(nodes) => {
                let parts: Vec<String> = nodes.iter().map(|n| n.write(names, false)).collect();
                match top {
                    true => parts.join("\n     | "),
                    false => format!("({})", parts.join(" | ")),
                }
            }
        }
    }
}

/// The reader of a GBNF text.
struct Reader<'a> {
    text: &'a [char],
    pos: usize,
    /// Parentheses open here.
    nesting: usize,
}

impl Reader<'_> {
    fn cur(&self) -> Option<char> {
        self.text.get(self.pos).copied()
    }

    fn fail(&self, message: &str) -> Error {
        let line = self.text[..self.pos.min(self.text.len())]
            .iter()
            .filter(|&&c| c == '\n')
            .count()
            + 1;
        let near: String = self.text[self.pos.min(self.text.len())..]
            .iter()
            .take(20)
            .collect();
        Error::Input(format!(
            "grammar (GBNF): {message} at line {line}, before {near:?}"
        ))
    }

    fn skip_space(&mut self, newlines: bool) {
        while let Some(c) = self.cur() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newlines => self.pos += 1,
                '#' => {
                    while self.cur().is_some_and(|c| c != '\n' && c != '\r') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn word_char(c: char) -> bool {
        c.is_alphanumeric() || c == '-' || c == '_'
    }

    fn name(&mut self) -> Result<String> {
        let start = self.pos;
        while self.cur().is_some_and(Self::word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.fail("expected a rule name"));
        }
        Ok(self.text[start..self.pos].iter().collect())
    }

    fn int(&mut self) -> Result<usize> {
        let start = self.pos;
        while self.cur().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let digits: String = self.text[start..self.pos].iter().collect();
        digits
            .parse()
            .map_err(|_| self.fail("expected a number of repetitions"))
    }

    /// One character of a literal or class, an escape kept as written (`\xHH`, `\u{...}`).
    fn char(&mut self) -> Result<String> {
        let Some(c) = self.cur() else {
            return Err(self.fail("unexpected end of the grammar"));
        };
        self.pos += 1;
        if c != '\\' {
            return Ok(c.to_string());
        }
        let Some(e) = self.cur() else {
            return Err(self.fail("incomplete escape"));
        };
        self.pos += 1;
        let hex = |r: &mut Self, n: usize| -> Result<String> {
            let digits: String = r.text[r.pos..(r.pos + n).min(r.text.len())]
                .iter()
                .collect();
            if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(r.fail(&format!("invalid \\{e} escape")));
            }
            r.pos += n;
            Ok(digits)
        };
        match e {
            '"' | '\\' | '[' | ']' | 'n' | 'r' | 't' => Ok(format!("\\{e}")),
            'x' => Ok(format!("\\x{}", hex(self, 2)?)),
            'u' => Ok(format!("\\u{}", hex(self, 4)?)),
            'U' => {
                // Lark's strings and regexes take at most \uHHHH: write the character itself.
                let digits = hex(self, 8)?;
                let code = u32::from_str_radix(&digits, 16)
                    .ok()
                    .and_then(char::from_u32);
                code.map(|c| c.to_string())
                    .ok_or_else(|| self.fail("invalid \\U escape"))
            }
            _ => Err(self.fail(&format!("invalid escape \\{e}"))),
        }
    }

    fn class(&mut self) -> Result<Node> {
        self.pos += 1; // '['
        let mut rx = String::from("[");
        loop {
            let c = self.char()?;
            match c.as_str() {
                "/" | "[" => rx.push_str(&format!("\\{c}")),
                _ => rx.push_str(&c),
            }
            if c == "]" {
                return Ok(Node::Regex(rx));
            }
        }
    }

    fn literal(&mut self) -> Result<Node> {
        self.pos += 1; // '"'
        let mut s = String::new();
        loop {
            let c = self.char()?;
            if c == "\"" {
                return Ok(Node::Literal(s));
            }
            s.push_str(&c);
        }
    }

    fn repetition(&mut self, nodes: &mut [Node]) -> Result<()> {
        let Some(last) = nodes.last_mut() else {
            return Ok(());
        };
        let (lo, hi) = match self.cur() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.pos += 1;
                self.skip_space(true);
                let lo = self.int()?;
                self.skip_space(true);
                let hi = match self.cur() {
                    Some('}') => Some(lo),
                    Some(',') => {
                        self.pos += 1;
                        self.skip_space(true);
                        let hi = match self.cur() {
                            Some(c) if c.is_ascii_digit() => Some(self.int()?),
                            _ => None,
                        };
                        self.skip_space(true);
                        if self.cur() != Some('}') {
                            return Err(self.fail("expected '}'"));
                        }
                        hi
                    }
                    _ => return Err(self.fail("expected ',' or '}'")),
                };
                (lo, hi)
            }
            _ => return Ok(()),
        };
        self.pos += 1;
        let inner = std::mem::replace(last, Node::Seq(Vec::new()));
        *last = Node::Repeat(Box::new(inner), lo, hi);
        Ok(())
    }

    fn sequence(&mut self, nested: bool) -> Result<Node> {
        let mut nodes = Vec::new();
        while let Some(c) = self.cur() {
            if c == '|' || c == ')' || (!nested && (c == '\r' || c == '\n')) {
                break;
            }
            match c {
                '"' => nodes.push(self.literal()?),
                '[' => nodes.push(self.class()?),
                '(' => {
                    if self.nesting >= MAX_GBNF_NESTING {
                        return Err(self.fail(&format!(
                            "parentheses nested more than {MAX_GBNF_NESTING} deep"
                        )));
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    self.nesting += 1;
                    let alternatives = self.alternatives(true)?;
                    self.nesting -= 1;
                    if self.cur() != Some(')') {
                        return Err(self.fail("expected ')'"));
                    }
                    self.pos += 1;
                    nodes.push(alternatives);
                }
                '.' => {
                    self.pos += 1;
                    nodes.push(Node::Regex(".".into()));
                }
                c if Self::word_char(c) => nodes.push(Node::Ref(self.name()?)),
                _ => return Err(self.fail(&format!("unexpected {c:?}"))),
            }
            self.skip_space(nested);
            self.repetition(&mut nodes)?;
            self.skip_space(nested);
        }
        Ok(Node::Seq(nodes))
    }

    fn alternatives(&mut self, nested: bool) -> Result<Node> {
        let mut alternatives = Vec::new();
        loop {
            alternatives.push(self.sequence(nested)?);
            self.skip_space(nested);
            if self.cur() != Some('|') {
                return Ok(Node::Alt(alternatives));
            }
            self.pos += 1;
            self.skip_space(true);
        }
    }
}

/// The Lark text of a GBNF grammar (see the module docs); a syntax error, an undefined rule, a
/// missing `root`, or a grammar past the limits of [`super::grammar_limits`] (size, nesting,
/// rule chains) is an error naming it.
pub fn gbnf_to_lark(text: &str) -> Result<String> {
    check_size("grammar (GBNF)", text.len(), MAX_GRAMMAR_BYTES)?;
    let chars: Vec<char> = text.chars().collect();
    let mut r = Reader {
        text: &chars,
        pos: 0,
        nesting: 0,
    };
    let mut rules: Vec<(String, Node)> = Vec::new();
    r.skip_space(true);
    while r.cur().is_some() {
        let name = r.name()?;
        r.skip_space(false);
        if !chars[r.pos..].starts_with(&[':', ':', '=']) {
            return Err(r.fail(&format!("expected ::= after {name}")));
        }
        r.pos += 3;
        r.skip_space(true);
        let body = r.alternatives(false)?.simplify();
        if rules.iter().any(|(n, _)| *n == name) {
            return Err(r.fail(&format!("rule {name} is defined twice")));
        }
        rules.push((name, body));
        r.skip_space(true);
    }
    let defined: HashMap<String, bool> = rules.iter().map(|(n, _)| (n.clone(), false)).collect();
    for (name, body) in &rules {
        let mut refs = Vec::new();
        body.refs(&mut refs);
        if let Some(missing) = refs.iter().find(|r| !defined.contains_key(**r)) {
            return Err(Error::Input(format!(
                "grammar (GBNF): rule {name} refers to {missing}, which is not defined"
            )));
        }
    }
    if !defined.contains_key("root") {
        return Err(Error::Input("grammar (GBNF): no root rule".into()));
    }
    // Chains of rules bounded before the fixed point below (one pass per link at most).
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str(), i))
        .collect();
    let edges: Vec<Vec<usize>> = rules
        .iter()
        .map(|(_, body)| {
            let mut refs = Vec::new();
            body.refs(&mut refs);
            refs.iter().map(|r| index[r]).collect()
        })
        .collect();
    check_rule_depth("grammar (GBNF)", &chain_depths(&edges))?;
    // Terminals: rules built only of terminals, to a fixed point (root never is one).
    let mut terminals = defined;
    loop {
        let mut changed = false;
        for (name, body) in &rules {
            if name != "root" && !terminals[name] && body.terminal(&terminals) {
                terminals.insert(name.clone(), true);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut names: HashMap<String, String> = HashMap::new();
    for (name, _) in &rules {
        let lark = if name == "root" {
            "start".to_string()
        } else {
            let mut snake = String::new();
            let mut prev_lower = false;
            for c in name.chars() {
                if c.is_ascii_uppercase() && prev_lower {
                    snake.push('_');
                }
                prev_lower = c.is_ascii_lowercase();
                snake.push(if c == '-' { '_' } else { c });
            }
            match terminals[name] {
                true => snake.to_uppercase(),
                false => snake.to_lowercase(),
            }
        };
        if names.values().any(|n| *n == lark) || (lark == "start" && name != "root") {
            return Err(Error::Input(format!(
                "grammar (GBNF): rule {name} collides with another as {lark}"
            )));
        }
        names.insert(name.clone(), lark);
    }
    let mut out = String::from("%llguidance {}\n\n");
    for (name, body) in &rules {
        out.push_str(&format!("{}: {}\n", names[name], body.write(&names, true)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_terminals_and_repetitions() {
        let gbnf = "root ::= answer (\", \" answer){0,2}\nanswer ::= \"yes\" | \"no\" | num\nnum ::= [0-9]+ # digits\n";
        let lark = gbnf_to_lark(gbnf).unwrap();
        assert_eq!(
            lark,
            "%llguidance {}\n\nstart: ANSWER (\", \" ANSWER){0,2}\nANSWER: \"yes\"\n     | \"no\"\n     | NUM\nNUM: /[0-9]/+\n"
        );
        // A recursive rule stays a rule; names are made Lark's.
        let lark = gbnf_to_lark(
            "root ::= my-list\nmy-list ::= \"[\" (item (\",\" my-list)?)? \"]\"\nitem ::= [a-z]\n",
        )
        .unwrap();
        assert!(lark.contains("start: my_list\nmy_list: \"[\""), "{lark}");
        assert!(lark.contains("ITEM: /[a-z]/"), "{lark}");
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |g: &str| gbnf_to_lark(g).unwrap_err().to_string();
        assert!(err("start ::= \"a\"").contains("no root rule"));
        assert!(err("root ::= thing").contains("thing, which is not defined"));
        assert!(err("root = \"a\"").contains("expected ::="));
        assert!(err("root ::= \"a").contains("unexpected end"));
        assert!(err("root ::= [a-").contains("unexpected end"));
        assert!(err("root ::= \"a\"{2").contains("expected ',' or '}'"));
        assert!(err("root ::= \"\\q\"").contains("invalid escape"));
    }
}
