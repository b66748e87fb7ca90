//! PyTorch checkpoints read without Python (`store::torch_file`): every kind of tensor of a
//! `torch.save`d state dict (tests/fixtures/torch, made by its make.py) has torch's shape and
//! values; a Marian model whose directory holds `pytorch_model.bin` instead of
//! `model.safetensors` loads with the same weights and translates the same; legacy, truncated
//! and foreign files are errors naming the file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use transformer::decode::greedy::GreedyOptions;
use transformer::model::Module;
use transformer::pipeline::translate::Translator;
use transformer::store::torch_file::read_torch_tensors;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[derive(serde::Deserialize)]
struct Expected {
    shape: Vec<usize>,
    values: Vec<f32>,
}

#[test]
fn every_kind_of_tensor_reads_as_torch_saved_it() {
    let tensors = read_torch_tensors(&fixture("torch/tensors.bin"), |_| false).unwrap();
    let json = std::fs::read(fixture("torch/tensors.json")).unwrap();
    let expected: HashMap<String, Expected> = serde_json::from_slice(&json).unwrap();
    // The int64 buffer is left out; every float tensor is there, exactly.
    assert!(!tensors.contains_key("position_ids"));
    assert_eq!(tensors.len(), expected.len());
    for (name, want) in &expected {
        let (shape, values) = &tensors[name];
        assert_eq!(shape, &want.shape, "{name}");
        assert_eq!(values, &want.values, "{name}");
    }
    // A transposed view reads its storage by its strides.
    let (f32s, transposed) = (&tensors["f32"].1, &tensors["transposed"].1);
    assert_eq!(transposed[1], f32s[4]);
    // Skipped names are left out.
    let some = read_torch_tensors(&fixture("torch/tensors.bin"), |n| n != "row").unwrap();
    assert_eq!(some.keys().collect::<Vec<_>>(), ["row"]);
}

/// The Marian fixture with `pytorch_model.bin` in place of `model.safetensors`.
fn marian_from_torch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("marian")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(
        fixture("torch/marian.bin"),
        dir.path().join("pytorch_model.bin"),
    )
    .unwrap();
    dir
}

#[test]
fn a_marian_directory_with_pytorch_model_bin_loads_the_same_model() {
    let dir = marian_from_torch();
    let mut from_torch = Translator::load(dir.path()).unwrap();
    let mut from_safetensors = Translator::load(&fixture("marian")).unwrap();
    let (a, b) = (
        from_torch.model.named_params(""),
        from_safetensors.model.named_params(""),
    );
    assert_eq!(a.len(), b.len());
    for ((na, pa), (nb, pb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_eq!(pa.value.data, pb.value.data, "{na}");
    }
    drop((a, b));
    from_torch.prepare_inference();
    from_safetensors.prepare_inference();
    let lines = vec![
        "Das Haus ist alt.".to_string(),
        "Er gab uns nur einen Bericht.".into(),
    ];
    let options = GreedyOptions::default();
    assert_eq!(
        from_torch.translate(&lines, &options).unwrap(),
        from_safetensors.translate(&lines, &options).unwrap()
    );
}

#[test]
fn bad_pytorch_files_are_clear_errors() {
    let error = |path: &Path| read_torch_tensors(path, |_| false).unwrap_err().to_string();
    let e = error(&fixture("torch/legacy.bin"));
    assert!(
        e.contains("legacy.bin") && e.contains("legacy format"),
        "{e}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture("torch/marian.bin")).unwrap();
    for n in [0, 10, bytes.len() / 3, bytes.len() - 30] {
        let path = tmp.path().join(format!("cut{n}.bin"));
        std::fs::write(&path, &bytes[..n]).unwrap();
        let e = error(&path);
        assert!(e.contains(&format!("cut{n}.bin")), "{e}");
    }
    let path = tmp.path().join("text.bin");
    std::fs::write(&path, b"not a checkpoint at all").unwrap();
    assert!(error(&path).contains("zip"), "{}", error(&path));
    // Damaged bytes anywhere: an error or a load, never a panic.
    for i in (0..bytes.len()).step_by(997) {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x5a;
        let path = tmp.path().join("damaged.bin");
        std::fs::write(&path, &damaged).unwrap();
        let _ = read_torch_tensors(&path, |_| false);
    }
    // A directory with neither safetensors nor pytorch_model.bin names what it looked for.
    let dir = marian_from_torch();
    std::fs::remove_file(dir.path().join("pytorch_model.bin")).unwrap();
    let e = Translator::load(dir.path()).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
}
