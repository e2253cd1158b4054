import json

from nanscope.cli.main import main


def test_hazards_cli_json(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["hazards", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {h["name"]: h for h in doc["hazards"]}
    assert set(rows) == {"healthy", "kl-exp-overflow", "ratio-exp-overflow", "nan-rollout-logprob", "nan-reward"}
    assert set(rows["healthy"]) == {"name", "mechanism", "loss_finite", "grad_finite", "nan_grad_entries"}
    assert (rows["kl-exp-overflow"]["loss_finite"], rows["kl-exp-overflow"]["grad_finite"]) == (True, False)
    assert rows["nan-reward"]["loss_finite"] is False and rows["nan-reward"]["nan_grad_entries"] > 0
    assert rows["healthy"]["nan_grad_entries"] == 0
    assert "kl-exp-overflow" in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
