"""Reports: read run directories into one table, and render it (terminal, CSV/Parquet, HTML, W&B).

table.py (rows, summary files, terminal) · predicted.py (the plan's prediction) · headline.py (which layout
to use) · verdict.py (A against B, only as far as the intervals allow) · repeats.py (a point's repeats pooled)
· plots.py + html.py (the HTML report, plotly) · wandb_report.py (the W&B report spec, publish)
· wandb_offline.py (read a `.wandb` file back) · build.py (`build_report`, what `harness report` runs)
· plan_view.py (`harness plan`'s table) · wandb_sync.py (`harness sync`).
"""
