#!/usr/bin/env bash
# Translation requests into English for the v3 data (issue 17: translation is the drop-in path's one category under
# plain, where the drafter's first token is accepted 15% of the time; the builder only translates out of English),
# by back-translation with the verifier (recipes/make_back_translation_prompts.py): 2,400 English sentences
# translated out of English (greedy), the non-degenerate translations asked back into English, the verifier's greedy
# and temperature-0.7 responses to those. bf16, batch 128. Resumable: rerun after an interruption; the rows made are
# kept in datasets/smollm2-v3 like the rest of the v3 data.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/smollm2_v3}
SNAPSHOT=datasets/smollm2-v3
VERIFIER=smollm2-135m-instruct
GENERATE="hf-specdiff distill-data --verifier $VERIFIER --samples-per-prompt 1 --batch-size 128 --dtype bf16"
[ -d "$SNAPSHOT" ] && python recipes/data_snapshot.py restore "$SNAPSHOT" "$RUN"
[ -f "$RUN/translate_forward.jsonl" ] || \
    python recipes/make_back_translation_prompts.py forward --out "$RUN/translate_forward.jsonl"
$GENERATE --prompts "$RUN/translate_forward.jsonl" --out "$RUN/data_translate_forward" --temperature 0 \
    --max-new-tokens 64
[ -f "$RUN/translate_en.jsonl" ] || python recipes/make_back_translation_prompts.py reverse \
    --forward "$RUN/translate_forward.jsonl" --data "$RUN/data_translate_forward" --out "$RUN/translate_en.jsonl"
$GENERATE --prompts "$RUN/translate_en.jsonl" --out "$RUN/data_translate_greedy" --temperature 0 --max-new-tokens 128
$GENERATE --prompts "$RUN/translate_en.jsonl" --out "$RUN/data_translate_sampled" --temperature 0.7 \
    --max-new-tokens 128
python recipes/data_snapshot.py save "$RUN" "$SNAPSHOT"
