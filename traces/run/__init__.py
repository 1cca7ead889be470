"""MTP runs through llama.cpp: the runtime, the recording worker, the recorder, replay."""
