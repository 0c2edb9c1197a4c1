"""Pure planning: observed state + spec -> a Plan (steps, events, status), for each
resource we own. Nothing in this package performs I/O; `meshnet.operator` (and, for
routes, `meshnet.local`) observes and carries the plan out.

- `reconcile.route`: ShardRoutes -> stage pods, the headless Service, the gateway.
- `reconcile.artifact`: ModelArtifacts -> provisioning Jobs, node labels, status.
- shared: `plan` (the Plan/Step shape), `conditions` (the one condition stamper),
  `resource` (what every resource we own is observed as), `naming` (children's names),
  `children` (what every child pod shares).
"""
