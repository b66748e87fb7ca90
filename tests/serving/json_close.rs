//! Two JSON answers equal but for the last bits of their numbers.
//!
//! The same request's log-probabilities may round differently when the engine batches it
//! differently: a decode step of one row goes through the matrix-vector kernel, a step shared
//! with other rows (or with another request's prompt chunk) through the matrix product, and
//! the two sum in different orders. Which happens depends on when concurrent requests arrive,
//! so tests that compare answers across requests compare their numbers to a bound; the tokens,
//! texts and every other field must still be identical.

use serde_json::Value;

/// Panics with the path of the first difference unless `a` and `b` have the same shape and
/// strings, and their numbers differ by at most `tol`.
pub fn assert_json_close(a: &Value, b: &Value, tol: f64) {
    check(a, b, tol, "$");
}

fn check(a: &Value, b: &Value, tol: f64, path: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                (x - y).abs() <= tol,
                "{path}: {x} and {y} differ by more than {tol}"
            );
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}: lengths");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                check(x, y, tol, &format!("{path}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
            let (mut kx, mut ky) = (keys(x), keys(y));
            kx.sort();
            ky.sort();
            assert_eq!(kx, ky, "{path}: keys");
            for (k, v) in x {
                check(v, &y[k], tol, &format!("{path}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

#[test]
fn close_numbers_pass_and_other_differences_fail() {
    use serde_json::json;
    let a =
        json!({"token": "x", "logprob": -5.562819480895996, "bytes": [120], "top": [{"y": -1.0}]});
    let b =
        json!({"token": "x", "logprob": -5.562819004058838, "bytes": [120], "top": [{"y": -1.0}]});
    assert_json_close(&a, &b, 1e-5);
    for (bad, tol) in [
        (
            json!({"token": "x", "logprob": -5.5, "bytes": [120], "top": [{"y": -1.0}]}),
            1e-5,
        ),
        (
            json!({"token": "z", "logprob": -5.562819004058838, "bytes": [120], "top": [{"y": -1.0}]}),
            1.0,
        ),
        (
            json!({"token": "x", "logprob": -5.56, "bytes": [120, 1], "top": [{"y": -1.0}]}),
            1.0,
        ),
        (
            json!({"token": "x", "logprob": -5.56, "bytes": [120], "top": [{"z": -1.0}]}),
            1.0,
        ),
    ] {
        let caught = std::panic::catch_unwind(|| assert_json_close(&a, &bad, tol));
        assert!(caught.is_err(), "{bad} passed");
    }
}
