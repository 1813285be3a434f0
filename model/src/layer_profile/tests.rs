use super::*;

fn layer(f: f64) -> RawLayer {
    RawLayer {
        f_ms: Some(f),
        i_ms: Some(f),
        w_ms: Some(f / 2.0),
        params: Some(10),
        param_bytes: Some(40),
        stash_bytes: Some(64),
        weight_stash_bytes: Some(32),
        output_bytes: Some(16),
        flops: None,
    }
}

fn raw(layers: Vec<RawLayer>) -> RawLayerProfile {
    RawLayerProfile {
        version: Some(1),
        microbatch_size: Some(8),
        device: Some("test".into()),
        tp: None,
        layers: Some(layers),
    }
}

fn err(r: RawLayerProfile) -> String {
    LayerProfile::from_raw(r).unwrap_err().to_string()
}

#[test]
fn a_profile_round_trips_through_its_json() {
    let p = LayerProfile::from_raw(raw(vec![layer(1.0), layer(2.0)])).unwrap();
    let text = serde_json::to_string_pretty(&p.to_raw()).unwrap();
    assert_eq!(LayerProfile::from_json(&text).unwrap(), p);
    assert_eq!(p.len(), 2);
    assert_eq!(p.microbatch_size, 8);
}

#[test]
fn bad_json_is_named_by_line_and_column() {
    let e = LayerProfile::from_json("{\n  \"version\": 1,\n  \"layers\": [ {\"f_ms\": oops} ]\n}")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("profile, line 3, column "), "{e}");
    let e = LayerProfile::from_json("{\"version\": 1, \"colour\": 2}")
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `colour`"), "{e}");
    let e = LayerProfile::from_json("{\"layers\": [{\"params\": -1}]}")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("profile, line 1, column"), "{e}");
}

#[test]
fn a_bad_value_is_named_by_layer_and_field() {
    let mut l = layer(1.0);
    l.i_ms = Some(-2.0);
    assert_eq!(
        err(raw(vec![layer(1.0), l])),
        "profile: layer 1: i_ms must be 0 or from 0.000001 to 10000000 ms, as a layer can take (got -2)"
    );
    let mut l = layer(1.0);
    l.output_bytes = None;
    assert_eq!(
        err(raw(vec![layer(1.0), layer(1.0), l])),
        "profile: layer 2: output_bytes is missing"
    );
    let mut l = layer(1.0);
    l.f_ms = Some(f64::NAN);
    assert!(err(raw(vec![l])).starts_with("profile: layer 0: f_ms must be 0 or from 0.000001 to"));
    let mut l = layer(1.0);
    l.param_bytes = Some(0);
    assert_eq!(
        err(raw(vec![l])),
        "profile: layer 0: param_bytes (0) and params (10) must both be 0 or both positive"
    );
    let mut with = layer(1.0);
    with.flops = Some(1e6);
    assert_eq!(
        err(raw(vec![with.clone(), layer(1.0), with])),
        "profile: layer 1: flops is missing (give flops for every layer or for none)"
    );
}

#[test]
fn bad_top_level_fields_are_named() {
    let mut r = raw(vec![layer(1.0)]);
    r.version = Some(7);
    assert_eq!(
        err(r),
        "profile: version 7 is not known (this build reads version 1)"
    );
    let mut r = raw(vec![layer(1.0)]);
    r.version = None;
    assert_eq!(err(r), "profile: version is missing");
    let mut r = raw(vec![layer(1.0)]);
    r.microbatch_size = Some(0);
    assert_eq!(err(r), "profile: microbatch_size must be at least 1");
    assert_eq!(err(raw(vec![])), "profile: layers is missing or empty");
    assert_eq!(
        err(raw(vec![layer(0.0), layer(0.0)])),
        "profile: every layer's time is 0: nothing to balance or plan"
    );
}

#[test]
fn balanced_cuts_minimise_the_largest_stage() {
    let cuts = balanced(&[1.0, 1.0, 1.0, 3.0, 1.0, 1.0], 3).unwrap();
    assert_eq!(cuts, vec![0..3, 3..4, 4..6]);
    assert_eq!(balanced(&[1.0; 3], 4), None);
    assert_eq!(balanced(&[1.0; 3], 0), None);
    let p = LayerProfile::from_raw(raw(vec![layer(1.0), layer(1.0), layer(2.0)])).unwrap();
    assert_eq!(p.cuts(2).unwrap(), vec![0..2, 2..3]);
}

#[test]
fn totals_past_what_can_be_summed_are_refused_not_overflowed() {
    // Times and FLOPs no layer can have (and whose sums would pass the largest number) are
    // refused by the layer's range first.
    let big = |f: f64| {
        let mut l = layer(1.0);
        (l.f_ms, l.i_ms, l.w_ms) = (Some(f), Some(f), Some(f));
        l
    };
    assert!(err(raw(vec![big(1e308), big(1e308)]))
        .starts_with("profile: layer 0: f_ms must be 0 or from 0.000001 to 10000000 ms"));
    assert!(err(raw(vec![big(1e-300)])).contains("f_ms must be 0 or from"));
    let mut l = layer(1.0);
    l.flops = Some(1e308);
    assert!(err(raw(vec![l.clone(), l]))
        .starts_with("profile: layer 0: flops must be 0 or from 1 to 1e21"));
    // Sizes whose totals would overflow the memory model's sums.
    let mut l = layer(1.0);
    l.params = Some(u64::MAX);
    assert_eq!(
        err(raw(vec![layer(1.0), l])),
        "profile: layer 1: params makes the layers' total more than 2^50 (1125899906842624)"
    );
    let mut l = layer(1.0);
    l.stash_bytes = Some(1 << 49);
    assert_eq!(
        err(raw(vec![l.clone(), l.clone(), l])),
        "profile: layer 2: stash_bytes makes the layers' total more than 2^50 (1125899906842624)"
    );
}

/// A profile measured on one TP rank says its degree, which survives the file; an absent
/// `tp` is 1 and a degree of 0 is refused, naming the field.
#[test]
fn a_profile_s_tp_round_trips_and_is_checked() {
    let p = LayerProfile::from_raw(raw(vec![layer(1.0)])).unwrap();
    assert_eq!(p.tp, 1);
    let p = LayerProfile::from_raw(RawLayerProfile {
        tp: Some(4),
        ..raw(vec![layer(1.0)])
    })
    .unwrap();
    assert_eq!(p.tp, 4);
    let text = serde_json::to_string(&p.to_raw()).unwrap();
    assert!(text.contains("\"tp\":4"), "{text}");
    assert_eq!(LayerProfile::from_json(&text).unwrap(), p);
    let e = err(RawLayerProfile {
        tp: Some(0),
        ..raw(vec![layer(1.0)])
    });
    assert!(e.starts_with("profile: tp 0 must be from 1 to"), "{e}");
}
