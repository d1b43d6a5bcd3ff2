"""A file added to utils/ after the workdir was locked."""  # EXPECT: PF003
