import math

import numpy as np

from pipeline import detection


def _nota(auroc_regrab, auroc_proto, best="mutual_information"):
    def cell(auroc, chosen, point):
        det = {k: {"auroc": auroc[k], "aupr": auroc[k] - 10, "fpr95": 100 - auroc[k]}
               for k in auroc}
        return {"acc": 50.0, "detection": det, "best": chosen, "best_point": point,
                "roc": list(np.linspace(0, 100, 51))}
    return {"regrab": {"5w1s_r50": cell(auroc_regrab, best, "entropy")},
            "proto": {"5w1s_r50": cell(auroc_proto, "entropy", "entropy")}}


def test_paired_detection_sets_regrab_best_against_point_scores():
    nota = {"split_0": _nota({"entropy": 70, "mutual_information": 75}, {"entropy": 72}),
            "split_1": _nota({"entropy": 71, "mutual_information": 74}, {"entropy": 73})}
    out = detection.summarise_detection(nota)
    best = out["detection"]["regrab"]["5w1s_r50"]["best"]
    assert best["auroc"]["mean"] == 74.5 and best["chosen"] == {
        "split_0": "mutual_information", "split_1": "mutual_information"}
    pair = out["detection_paired"]
    vs_proto = pair["regrab_minus_proto"]["5w1s_r50"]
    assert vs_proto["auroc"]["diff"] == 2.0 and vs_proto["auroc"]["wins"] == 2
    # FPR@95: lower is better, so a lower REGRAB value is a win.
    assert vs_proto["fpr95"]["diff"] == -2.0 and vs_proto["fpr95"]["wins"] == 2
    gain = pair["regrab_posterior_gain"]["5w1s_r50"]["auroc"]
    assert gain["diff"] == 4.0 and gain["per_split"] == {"split_0": 5, "split_1": 3}
    assert math.isfinite(gain["ci95"])
    lines = "\n".join(detection.markdown_detection(out))
    assert "regrab_posterior_gain" in lines and "+2.00" in lines
    head = detection.headline_detection(out)
    assert head["detection"]["regrab"]["5w1s_r50"] == {"auroc": 74.5, "aupr": 64.5,
                                                       "fpr95": 25.5}


def test_selective_scores_and_roc_csv(tmp_path):
    cells = {f"split_{i}": {"regrab": {"5w1s": {"uncertainty": {
        "max_prob": {"aurc": 10.0 + i, "acc80": 90.0},
        "mutual_information": {"aurc": 8.0 + i, "acc80": 92.0}}}}} for i in range(2)}
    out = detection.summarise_uncertainty(cells, {"split_0": _nota({"entropy": 70}, {
        "entropy": 60}, best="entropy")})
    sel = out["selective_scores"]["regrab"]["5w1s"]
    assert sel["mutual_information"]["aurc"]["mean"] == 8.5
    assert "8.50" in "\n".join(detection.markdown_detection(out))
    assert detection.headline_detection(out)["aurc"] == {"regrab": {"5w1s": 10.5}}
    path = tmp_path / "roc.csv"
    detection.write_roc_csv(out, path)
    rows = path.read_text().splitlines()
    assert rows[0] == "fpr,regrab_5w1s_r50,proto_5w1s_r50" and len(rows) == 52
    assert rows[-1].startswith("100.0,100.000")
