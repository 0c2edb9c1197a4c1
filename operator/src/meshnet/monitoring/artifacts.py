"""Artifacts: how far each ModelArtifact's provisioning got, where its copies are, and
what failed."""

from __future__ import annotations

from meshnet.monitoring.board import Board, Query

SEL = 'namespace=~"$namespace", artifact=~"$artifact"'
BY = "max by (namespace, artifact)"
WHO = "{{namespace}}/{{artifact}}"


def artifacts() -> Board:
    board = Board(
        "meshnet-artifacts", "Meshnet / Artifacts",
        "ModelArtifact provisioning: bytes and files verified, per-node copies, failures.",
        variables=(
            ("namespace", "label_values(meshnet_artifact_size_bytes, namespace)"),
            ("artifact",
             'label_values(meshnet_artifact_size_bytes{namespace=~"$namespace"}, artifact)'),
        ))
    (board.row("Provisioning")
     .single("Ready", "Artifacts whose Ready condition is True.", "short",
             Query(f'sum(meshnet_artifact_condition{{{SEL}, condition="Ready", status="True"}})'))
     .single("Provisioning", "Artifacts still being copied or verified.", "short",
             Query(f"sum(meshnet_artifact_condition{{{SEL}, condition=\"Progressing\", "
                   'status="True"})'))
     .single("Failed", "Artifacts whose Failed condition is True (the reason is in the "
             "condition: DownloadFailed, HashMismatch, IncompleteSplitSet, StorageRefused).",
             "short",
             Query(f'sum(meshnet_artifact_condition{{{SEL}, condition="Failed", status="True"}})'))
     .single("Verified", "Bytes verified, as a share of the manifest's.", "percentunit",
             Query(f"sum(meshnet_artifact_verified_bytes{{{SEL}}}) / "
                   f"sum(meshnet_artifact_size_bytes{{{SEL}}})"))
     .graph("Bytes verified", "Bytes hashed and matched, against the manifest's total.",
            "bytes",
            Query(f"{BY} (meshnet_artifact_verified_bytes{{{SEL}}})", f"{WHO} verified"),
            Query(f"{BY} (meshnet_artifact_size_bytes{{{SEL}}})", f"{WHO} total"))
     .graph("Files verified", "Files whose sha256 matched, against the manifest's count.",
            "short",
            Query(f"{BY} (meshnet_artifact_verified_files{{{SEL}}})", f"{WHO} verified"),
            Query(f"{BY} (meshnet_artifact_files{{{SEL}}})", f"{WHO} total")))
    (board.row("Copies and failures")
     .graph("Per-node copies", "1 where a node's host-path copy is verified (stage pods "
            "of host-path artifacts are only scheduled there).", "short",
            Query(f"max by (namespace, artifact, node) (meshnet_artifact_node_copy_verified"
                  f"{{{SEL}}})", f"{WHO} on {{{{node}}}}"))
     .graph("Conditions", "Which condition holds for each artifact over time.", "short",
            Query(f'{BY} (meshnet_artifact_condition{{{SEL}, condition="Failed", '
                  'status="True"})', f"{WHO} failed"),
            Query(f'{BY} (meshnet_artifact_condition{{{SEL}, condition="Progressing", '
                  'status="True"})', f"{WHO} provisioning")))
    return board
