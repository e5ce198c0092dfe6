"""Output: where an encode's bytes go while it is made (`sinks`), confined atomic files
(`files`), the way a bytes output goes back (`handback`), the result built (`results`)."""
