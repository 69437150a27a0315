"""What both levels of bench/generate share: the prompts and how percentiles are taken."""

# Openings from the corpus's licences: the streams' prompts, in turn.
PROMPTS = ("This program is free software", "You may", "The Licensor ", "  2. ",
           "Copyright ", "the terms of ", "Each contributor", "THERE IS NO WARRANTY")


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]
