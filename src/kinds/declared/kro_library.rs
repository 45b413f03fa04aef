//! kro's CEL functions in the kind file's expressions, under kro's names and
//! with kro's results: `random.seededString(length, seed)`,
//! `random.seededInt(min, max, seed)`, `hash.fnv64a(s)` and `hash.sha256(s)`
//! (bytes), `base64.encode(bytes)` and `base64.decode(s)` (bytes; the `cel`
//! crate's encoders extension, cel-go's as kro has it), `json.unmarshal(s)`
//! (numbers as doubles) and `json.marshal(v)` (Go's JSON). The values are
//! `crate::functions::kro`'s, registered with the plain names by
//! `expressions.rs`; this module names them and builds the environment.
//!
//! A call `hash.sha256(s)` is, to the parser, `sha256` called on the name
//! `hash`; the `cel` crate calls the function named `hash.sha256` instead,
//! as cel-go does, and [`namespaced`] tells the kind file's checks that
//! `hash` there is no name the expression reads.

use std::sync::{Arc, LazyLock};

use cel::Env;
use cel::common::ast::{CallExpr, Expr};

/// kro's functions offered, by their qualified names.
pub const FUNCTIONS: [&str; 8] = [
    "random.seededString",
    "random.seededInt",
    "hash.fnv64a",
    "hash.sha256",
    "base64.encode",
    "base64.decode",
    "json.unmarshal",
    "json.marshal",
];

/// CEL's standard library and the encoders extension (`base64.*`), built
/// once for every expression.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Its names are the extension's own: they cannot clash.
    let _ = env.add_extension(cel::extensions::encoders);
    Arc::new(env)
});

/// The environment every expression is evaluated in.
pub fn env() -> Arc<Env> {
    ENV.clone()
}

/// The qualified name of kro's function `call` calls (`hash.sha256(s)`),
/// whose target is then a namespace, not a value.
pub fn namespaced(call: &CallExpr) -> Option<&'static str> {
    let Some(Expr::Ident(namespace)) = call.target.as_deref().map(|t| &t.expr) else {
        return None;
    };
    FUNCTIONS.into_iter().find(|f| {
        f.split_once('.')
            .is_some_and(|(n, name)| n == namespace && name == call.func_name)
    })
}
