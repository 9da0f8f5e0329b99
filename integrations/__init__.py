"""gradwatch inside the trainers people use: Lightning and Hugging Face ``Trainer``.

Each integration is a callback that calls :func:`gradwatch.trainer_hooks.watch` when
training starts, closes one gradwatch step per optimizer step and ends the run when
training ends. Install the extra that matches: ``pip install 'gradwatch[lightning]'``
or ``pip install 'gradwatch[transformers]'`` (neither pulls another torch).

Example:
    >>> from gradwatch.integrations.lightning import GradwatchCallback  # doctest: +SKIP
    >>> trainer = lightning.Trainer(callbacks=[GradwatchCallback(run="mnist")])  # doctest: +SKIP
"""
